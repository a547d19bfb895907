package tracing

import "go.opentelemetry.io/otel/attribute"

func serviceName(s string) attribute.KeyValue { return attribute.String("service.name", s) }
