package admin

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/status"

	"rolter.dev/pkg/telemetry"
)

// Span attributes of admin writes.
const (
	AttrMethod   = attribute.Key("rolter.admin.method")
	AttrDryRun   = attribute.Key("rolter.admin.dry_run")
	AttrCode     = attribute.Key("rolter.admin.code")
	AttrRevision = telemetry.AttrConfigRevision
	AttrChanges  = attribute.Key("rolter.config.changes")
	AttrApplied  = attribute.Key("rolter.config.applied")
)

type writeSpanKey struct{}

// writeSpan starts the span of an admin write ("admin.<Method>"), unless
// ctx already carries one (Apply starts its own before it parses, then
// updates). own reports whether the caller must end it.
func (s *Server) writeSpan(ctx context.Context, method string) (_ context.Context, span trace.Span, own bool) {
	if ctx.Value(writeSpanKey{}) != nil {
		return ctx, trace.SpanFromContext(ctx), false
	}
	ctx, span = s.tracer.Start(ctx, "admin."+method, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(AttrMethod.String(method)))
	return context.WithValue(ctx, writeSpanKey{}, true), span, true
}

// endWrite records the outcome of a write on its span: the config revision
// it produced, or the gRPC status it failed with.
func endWrite(span trace.Span, revision int64, err error) {
	if err != nil {
		st := status.Convert(err)
		span.SetAttributes(AttrCode.String(st.Code().String()))
		span.SetStatus(otelcodes.Error, st.Message())
		return
	}
	span.SetAttributes(AttrCode.String("OK"), AttrRevision.Int64(revision))
}
