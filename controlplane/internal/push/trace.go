package push

import (
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"rolter.dev/pkg/telemetry"
)

// TracerName is the instrumentation scope of the snapshot pushes' spans.
const TracerName = "rolter.dev/controlplane/push"

// Span attributes of a snapshot push ("push.snapshot"): one span per
// snapshot sent to one node, from the send to the node's answer.
const (
	AttrVersion        = telemetry.AttrConfigVersion
	AttrRevision       = telemetry.AttrConfigRevision
	AttrNodeID         = telemetry.AttrNodeID
	AttrNodeRole       = attribute.Key("rolter.node.role")
	AttrControlPlaneID = telemetry.AttrControlPlaneID
	// AttrResult is ack, nack, superseded (a newer snapshot went out
	// before the answer) or unanswered (the stream ended first).
	AttrResult = attribute.Key("rolter.push.result")
	// AttrNackReason is the node's reason for a nack.
	AttrNackReason = attribute.Key("rolter.push.nack_reason")
	// AttrNodeVersion is the version the node runs after answering.
	AttrNodeVersion = attribute.Key("rolter.node.version")
)

// endPush ends a push span with its result; nil is a no-op.
func endPush(span trace.Span, result, nodeVersion, reason string) {
	if span == nil {
		return
	}
	span.SetAttributes(AttrResult.String(result))
	switch result {
	case "ack":
		span.SetAttributes(AttrNodeVersion.String(nodeVersion))
	case "nack":
		span.SetAttributes(AttrNodeVersion.String(nodeVersion), AttrNackReason.String(reason))
		span.SetStatus(otelcodes.Error, "snapshot refused by the node")
	}
	span.End()
}
