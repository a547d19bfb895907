package cpfollow

import (
	"go.opentelemetry.io/otel/attribute"

	"rolter.dev/pkg/telemetry"
)

// TracerName is the instrumentation scope of the follower's spans.
const TracerName = "rolter.dev/dataplane/cpfollow"

// Attributes of the "cpfollow.snapshot" span, one per snapshot handled
// (received from a control plane, or loaded from the cache at startup).
const (
	AttrVersion        = telemetry.AttrConfigVersion
	AttrRevision       = telemetry.AttrConfigRevision
	AttrControlPlaneID = telemetry.AttrControlPlaneID
	AttrNodeID         = telemetry.AttrNodeID
	// AttrSource is controlplane or cache.
	AttrSource = attribute.Key("rolter.snapshot.source")
	// AttrResult is applied, unchanged (same content), stale (older than
	// the running one; ignored) or refused (NACKed, the old config keeps
	// serving).
	AttrResult = attribute.Key("rolter.snapshot.result")
	// AttrRunning is the version in use after the snapshot was handled.
	AttrRunning = attribute.Key("rolter.snapshot.running_version")
	// AttrError is why a refused snapshot was refused.
	AttrError = attribute.Key("rolter.snapshot.error")
)
