package app

import "go.opentelemetry.io/otel/attribute"

// Tracing. The watcher makes a span per applied engine batch
// ("kvwatcher.apply": provider, rank, source live/replay, engine sequence,
// event count), a child span per published delta ("kvwatcher.publish":
// provider, delta sequence, op count, bytes), and one per replay
// ("kvwatcher.replay", parent of the batches it applies). A batch is one
// engine step, at most a few hundred per second per replica, so a span each
// is affordable; heartbeats and snapshots are not traced. The tracer comes
// from Options.TracerProvider: RunService builds it with
// rolter.dev/pkg/telemetry, which exports over OTLP only when the standard
// OTEL_* variables ask for it.

const instrumentation = "rolter.dev/kvwatcher"

var (
	attrProvider = attribute.Key("kv.provider")
	attrRank     = attribute.Key("kv.rank")
)
