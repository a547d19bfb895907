package telemetry_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"

	"rolter.dev/pkg/telemetry"
)

func TestOffByDefault(t *testing.T) {
	for _, v := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(v, "")
	}
	if telemetry.Enabled() {
		t.Fatal("enabled without OTEL_* variables")
	}
	tp, stop, err := telemetry.Setup(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tp.(noop.TracerProvider); !ok {
		t.Errorf("provider %T, want the no-op one", tp)
	}
	if err := stop(context.Background()); err != nil {
		t.Error(err)
	}
	if telemetry.Tracer(nil, "x") == nil {
		t.Error("nil tracer for a nil provider")
	}
}

func TestEnabledByEnvironment(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
	if !telemetry.Enabled() {
		t.Error("OTEL_EXPORTER_OTLP_ENDPOINT does not enable tracing")
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	if telemetry.Enabled() {
		t.Error("OTEL_TRACES_EXPORTER=none does not disable tracing")
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	if !telemetry.Enabled() {
		t.Error("OTEL_TRACES_EXPORTER=otlp does not enable tracing")
	}
	tp, stop, err := telemetry.Setup(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tp.(noop.TracerProvider); ok {
		t.Error("a no-op provider while enabled")
	}
	if err := stop(context.Background()); err != nil {
		t.Error(err)
	}
}
