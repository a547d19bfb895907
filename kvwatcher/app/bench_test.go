package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace/noop"

	"rolter.dev/kvwatcher/internal/metrics"
	"rolter.dev/pkg/kvevents"
	"rolter.dev/pkg/natstest"
)

// BenchmarkPipeline measures the watcher's per-provider hot path on one
// core: decode a vLLM batch, derive the identities, update the state
// (capped, so removals flow too), encode the delta and publish it to an
// in-process NATS server. Each batch is one BlockStored run of 8 blocks of
// 16 tokens continuing a chain, as a request's prefill step produces.
func BenchmarkPipeline(b *testing.B) {
	for _, layout := range []struct {
		name string
		l    kvevents.Layout
	}{{"array", kvevents.LayoutArray}, {"map", kvevents.LayoutMap}} {
		for _, run := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("layout=%s/blocks=%d", layout.name, run), func(b *testing.B) {
				benchPipeline(b, layout.l, run)
			})
		}
	}
}

func benchPipeline(b *testing.B, layout kvevents.Layout, run int) {
	s := natstest.Start(b)
	nc := natstest.Connect(b, s)
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	w := &Watcher{opts: Options{NATS: nc}, log: testLogger(), metrics: m, epoch: 1, tracer: noop.NewTracerProvider().Tracer("")}
	spec := Provider{Name: "p", KV: &KVSpec{Endpoint: "tcp://127.0.0.1:1", Mode: ModeConnect, Model: "m", MaxBlocks: 200_000, Stale: time.Second}}
	w.opts.Queue = 1
	k := newWorker(w, spec, 0)
	k.ctx = context.Background()
	k.ranks[0].connected = true

	// Pre-encode batches: chains of run blocks, each continuing the last.
	const nbatches = 1024
	payloads := make([][]byte, nbatches)
	var engine uint64
	for i := range payloads {
		ev := &kvevents.BlockStored{BlockSize: 16, Medium: kvevents.Some("GPU"), TokenIDs: make([]uint32, 16*run),
			ExtraKeys: make([]kvevents.ExtraKey, run), GroupIdx: kvevents.Some[int64](0), KVCacheSpecKind: kvevents.Some("full_attention")}
		for j := range ev.TokenIDs {
			ev.TokenIDs[j] = uint32(i*7919 + j)
		}
		if i%16 != 0 {
			ev.ParentBlockHash = kvevents.Some(kvevents.UintHash(engine))
		}
		for range run {
			engine++
			ev.BlockHashes = append(ev.BlockHashes, kvevents.UintHash(engine))
		}
		p, err := kvevents.Encode(&kvevents.Batch{TS: 1, Events: []kvevents.Event{ev}, DataParallelRank: kvevents.Some[int64](0)}, layout)
		if err != nil {
			b.Fatal(err)
		}
		payloads[i] = p
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		var live batch
		live.b, live.err = k.dec.Decode(payloads[i%nbatches])
		k.apply(k.ranks[0], uint64(i), live, "live")
		i++
	}
	b.StopTimer()
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N*run)/b.Elapsed().Seconds(), "blocks/s")
}
