# syntax=docker/dockerfile:1
# rolter-kvwatcher: built from the Go workspace at the repository root.
#   docker build -f deploy/docker/kvwatcher.Dockerfile -t rolter/rolter-kvwatcher:dev .
# The final image is distroless (no shell, no curl), so it has no HEALTHCHECK:
# the binary has no probe mode, and health is checked by the orchestrator
# instead (HTTP GET /healthz or /metrics on --metrics-listen :9465).

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# The whole repository: go.work names every module of the workspace.
COPY . .
RUN --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=cache,target=/go/pkg/mod \
    cd kvwatcher && go build -trimpath -ldflags="-s -w" -o /out/rolter-kvwatcher ./cmd/rolter-kvwatcher
# The --snapshot-cache directory, owned by the runtime user (nonroot,
# 65532), so that a volume mounted there starts writable.
RUN mkdir -p /out/state

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rolter-kvwatcher /usr/local/bin/rolter-kvwatcher
COPY --from=build --chown=65532:65532 /out/state /var/lib/rolter
USER nonroot:nonroot
EXPOSE 9465
ENTRYPOINT ["/usr/local/bin/rolter-kvwatcher"]
