package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"rolter.dev/pkg/kvevents"
	"rolter.dev/tests/vllmsim"
)

func TestParseKVFlags(t *testing.T) {
	c, err := parseFlags(nil, io.Discard)
	if err != nil || c.kv.Endpoint != "" || c.kv.Layout != kvevents.LayoutArray {
		t.Errorf("defaults: %+v, %v", c.kv, err)
	}
	c, err = parseFlags([]string{"--kv-events", "tcp://*:5557", "--kv-topic", "kv@a@m", "--kv-replay", "tcp://*:5558",
		"--kv-format", "map", "--kv-connect", "--kv-replay-legacy", "--kv-dp-rank", "2", "--kv-buffer-steps", "50"}, io.Discard)
	want := vllmsim.KVPublisherOptions{Endpoint: "tcp://*:5557", Topic: "kv@a@m", ReplayEndpoint: "tcp://*:5558",
		Layout: kvevents.LayoutMap, Connect: true, LegacyReplay: true, DataParallelRank: 2, BufferSteps: 50}
	if err != nil || c.kv != want {
		t.Errorf("kv flags: %+v, %v; want %+v", c.kv, err, want)
	}
	if _, err := parseFlags([]string{"--kv-format", "json"}, io.Discard); err == nil {
		t.Error("--kv-format json accepted")
	}
}

func TestRunRejectsBadKVEndpoint(t *testing.T) {
	if err := run(t.Context(), []string{"--listen", "127.0.0.1:0", "--kv-events", "udp://x:1"}, io.Discard); err == nil {
		t.Error("run accepted a udp kv endpoint")
	}
}

// TestRunPublishesKVEvents runs the command with --kv-events and checks that
// a completion's blocks arrive on a SUB, in map form with the topic.
func TestRunPublishesKVEvents(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--block-size", "4", "--kv-events", "tcp://127.0.0.1:0",
			"--kv-topic", "kv@sim@m", "--kv-format", "map"}, pw)
		pw.Close()
	}()
	logs := bufio.NewReader(pr)
	field := func(key string) string {
		line, err := logs.ReadString('\n')
		if err != nil {
			t.Fatalf("read log: %v", err)
		}
		_, rest, ok := strings.Cut(line, key+"=")
		if !ok {
			t.Fatalf("log line %q has no %s", line, key)
		}
		return strings.Fields(rest)[0]
	}
	addr, endpoint := field("addr"), field("endpoint")
	drained := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, logs); close(drained) }()

	sub := zmq4.NewSub(context.Background())
	defer sub.Close()
	if err := sub.Dial(endpoint); err != nil {
		t.Fatalf("dial %s: %v", endpoint, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	msgs := make(chan zmq4.Msg, 16)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				close(msgs)
				return
			}
			msgs <- m
		}
	}()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	// The subscription reaches the publisher asynchronously: repeat
	// distinct prompts until one's events arrive.
	deadline := time.After(10 * time.Second)
	for i := 0; ; i++ {
		body := `{"prompt":"` + strings.Repeat("w", 40) + strings.Repeat("x", i) + `","max_tokens":1}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		select {
		case m := <-msgs:
			msg, err := kvevents.ParseMessage(m.Frames)
			if err != nil {
				t.Fatal(err)
			}
			b, err := kvevents.Decode(msg.Payload)
			if err != nil {
				t.Fatal(err)
			}
			if string(msg.Topic) != "kv@sim@m" || b.Layout.Form != kvevents.FormMap || len(b.Events) == 0 || b.Events[0].Kind() != kvevents.KindBlockStored {
				t.Errorf("message: topic %q seq %d layout %+v events %d", msg.Topic, msg.Seq, b.Layout, len(b.Events))
			}
		case <-time.After(100 * time.Millisecond):
			continue
		case <-deadline:
			t.Fatal("no kv event arrived")
		}
		break
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after cancel")
	}
	<-drained
	_ = sub.Close()
	for range msgs {
	}
}
