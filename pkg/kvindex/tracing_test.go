package kvindex_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"rolter.dev/pkg/kvindex"
	"rolter.dev/pkg/natstest"
)

// TestResyncSpan: each snapshot resync is a kvindex.resync span naming the
// provider, the snapshot's epoch, sequence and size; deltas make none.
func TestResyncSpan(t *testing.T) {
	s := natstest.Start(t)
	f := newFakeWatcher(t, natstest.Connect(t, s), "p", 0xabc)
	f.delta(false, stored(1, 2, 3))
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ix, err := kvindex.New(natstest.Connect(t, s), []string{"p"}, kvindex.Options{TracerProvider: tp, RetryMin: 20 * time.Millisecond, SnapshotTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ix.Close)
	eventually(t, "fresh", func() bool { return ix.Fresh("p") })
	f.delta(false, stored(4))
	eventually(t, "the delta", func() bool { return ix.PrefixMatch("p", []uint64{1, 2, 3, 4}) == 4 })

	var resyncs []tracetest.SpanStub
	for _, sp := range exp.GetSpans() {
		if sp.Name != "kvindex.resync" {
			t.Errorf("unexpected span %q", sp.Name)
			continue
		}
		if sp.Status.Code == codes.Unset {
			resyncs = append(resyncs, sp) // a failed attempt (none expected) would be retried
		}
	}
	if len(resyncs) != 1 {
		t.Fatalf("%d successful resync spans, want 1", len(resyncs))
	}
	got := map[attribute.Key]attribute.Value{}
	for _, kv := range resyncs[0].Attributes {
		got[kv.Key] = kv.Value
	}
	if got["kv.provider"].AsString() != "p" || got["kv.epoch"].AsString() != "0000000000000abc" || got["kv.seq"].AsInt64() != 1 ||
		got["kv.ids"].AsInt64() != 3 || got["kv.parts"].AsInt64() != 1 {
		t.Errorf("attributes %v", resyncs[0].Attributes)
	}
}
