// Package tracing sets up OpenTelemetry tracing for the data plane.
//
// Tracing is off unless the standard OTLP variables ask for it
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or
// OTEL_TRACES_EXPORTER=otlp); the exporter then reads every other OTEL_*
// variable itself (headers, protocol options, timeouts), and
// OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES name the service. W3C trace
// context is propagated to upstreams either way, so a client's trace keeps
// going through rolter to the engine.
package tracing

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Enabled reports whether the environment asks for trace export.
func Enabled() bool {
	if v := os.Getenv("OTEL_TRACES_EXPORTER"); v != "" {
		return v == "otlp"
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup returns the tracer provider the environment asks for and a function
// that flushes and stops it. When tracing is off it returns a no-op provider.
func Setup(ctx context.Context, service string) (trace.TracerProvider, func(context.Context) error, error) {
	if !Enabled() {
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: otlp exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless())
	if err != nil {
		return nil, nil, fmt.Errorf("tracing: resource: %w", err)
	}
	if os.Getenv("OTEL_SERVICE_NAME") == "" {
		res, _ = resource.Merge(res, resource.NewSchemaless(serviceName(service)))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}
