// Package telemetry sets up OpenTelemetry tracing for rolter's processes
// (the proxy, the control plane, the kvwatcher).
//
// Tracing is off unless the standard OTLP variables ask for it
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or
// OTEL_TRACES_EXPORTER=otlp); the exporter then reads every other OTEL_*
// variable itself (headers, protocol options, timeouts), and
// OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES name the service.
package telemetry

import (
	"context"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/attribute"
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
// service names the process unless OTEL_SERVICE_NAME does.
func Setup(ctx context.Context, service string) (trace.TracerProvider, func(context.Context) error, error) {
	if !Enabled() {
		return noop.NewTracerProvider(), func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: otlp exporter: %w", err)
	}
	res := resource.Default()
	if os.Getenv("OTEL_SERVICE_NAME") == "" {
		res, _ = resource.Merge(res, resource.NewSchemaless(attribute.String("service.name", service)))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}

// Tracer returns tp's tracer of the named instrumentation scope, or a no-op
// tracer when tp is nil.
func Tracer(tp trace.TracerProvider, scope string) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(scope)
}

// Span attributes that more than one process sets, so that a config
// change can be followed from the control plane's push to each node's
// handling of it under the same names.
const (
	// AttrConfigVersion is a config snapshot's version string.
	AttrConfigVersion = attribute.Key("rolter.config.version")
	// AttrConfigRevision is the etcd revision a config snapshot was built at.
	AttrConfigRevision = attribute.Key("rolter.config.revision")
	// AttrNodeID names a proxy or kvwatcher to the control plane.
	AttrNodeID = attribute.Key("rolter.node.id")
	// AttrControlPlaneID names the control plane that sent a snapshot.
	AttrControlPlaneID = attribute.Key("rolter.controlplane.id")
)
