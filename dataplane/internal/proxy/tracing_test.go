package proxy

import (
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestTracingSpanTreeAndPropagation(t *testing.T) {
	a := newUpstream(t, "a")
	doc := openAuth + providers(a) + "[[routes]]\nmodel = \"m\"\nstrategy = \"least_load\"\ntargets = [{ provider = \"p0\" }]\n"
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	p := New(Options{TracerProvider: tp})
	applyDoc(t, p, doc)
	srv := newServer(t, p)
	const clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	resp, _ := post(t, srv+"/v1/chat/completions", "", `{"model":"m","messages":[]}`,
		"Traceparent", "00-"+clientTrace+"-00f067aa0ba902b7-01")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	root, ok := spans["rolter.request"]
	if !ok {
		t.Fatalf("no request span; got %v", spanNames(spans))
	}
	if root.SpanKind() != trace.SpanKindServer || root.SpanContext().TraceID().String() != clientTrace {
		t.Fatalf("request span kind %v trace %s: the client's trace was not continued", root.SpanKind(), root.SpanContext().TraceID())
	}
	for _, name := range []string{"auth", "route.select", "upstream.request"} {
		s, ok := spans[name]
		if !ok {
			t.Fatalf("no %s span; got %v", name, spanNames(spans))
		}
		if s.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the request span", name)
		}
	}
	attrs := map[string]string{}
	for _, kv := range spans["route.select"].Attributes() {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	if attrs["rolter.strategy"] != "least_load" || attrs["rolter.provider"] != "p0" || attrs["rolter.decision"] != "picked" {
		t.Fatalf("route.select attributes %v", attrs)
	}
	_, h := a.last()
	tp2 := h.Get("Traceparent")
	up := spans["upstream.request"].SpanContext()
	if !strings.Contains(tp2, clientTrace) || !strings.Contains(tp2, up.SpanID().String()) {
		t.Fatalf("upstream traceparent %q does not carry the upstream span %s", tp2, up.SpanID())
	}
}

func spanNames(m map[string]sdktrace.ReadOnlySpan) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
