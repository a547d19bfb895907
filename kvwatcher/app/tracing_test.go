package app

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"rolter.dev/pkg/natstest"
)

// TestTracing: an applied batch is a kvwatcher.apply span, and the delta
// it publishes a kvwatcher.publish child with its sequence, ops and size.
func TestTracing(t *testing.T) {
	s := natstest.Start(t)
	pub := newPub(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	w, err := New(Options{Source: StaticSource{kvProvider("p", pub.Endpoint())}, NATS: natstest.Connect(t, s), Logger: testLogger(),
		Registerer: prometheus.NewRegistry(), TracerProvider: tp, ReconnectMin: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if err := pub.WaitSubscribers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	a := newChain("sim-model", 3, 16, 100)
	send(t, pub, frames(topic, 7, encodeBatch(t, a.stored(0, 3)))...)

	var apply, publish tracetest.SpanStub
	eventually(t, "spans", func() bool {
		for _, s := range exp.GetSpans() {
			switch s.Name {
			case "kvwatcher.apply":
				apply = s
			case "kvwatcher.publish":
				publish = s
			}
		}
		return apply.Name != "" && publish.Name != ""
	})
	attrs := func(s tracetest.SpanStub) map[attribute.Key]attribute.Value {
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes {
			m[kv.Key] = kv.Value
		}
		return m
	}
	am, pm := attrs(apply), attrs(publish)
	if am["kv.provider"].AsString() != "p" || am["kv.engine_seq"].AsInt64() != 7 || am["kv.source"].AsString() != "live" ||
		am["kv.events"].AsInt64() != 1 || am["kv.rank"].AsInt64() != 0 {
		t.Errorf("apply span attributes %v", apply.Attributes)
	}
	if pm["kv.provider"].AsString() != "p" || pm["kv.seq"].AsInt64() != 1 || pm["kv.ops"].AsInt64() != 1 ||
		pm["messaging.message.body.size"].AsInt64() < 24 {
		t.Errorf("publish span attributes %v", publish.Attributes)
	}
	if publish.Parent.SpanID() != apply.SpanContext.SpanID() || publish.SpanContext.TraceID() != apply.SpanContext.TraceID() {
		t.Error("the publish span is not the apply span's child")
	}
}
