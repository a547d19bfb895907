# syntax=docker/dockerfile:1
# rolter-proxy: built from the Go workspace at the repository root.
#   docker build -f deploy/docker/dataplane.Dockerfile -t rolter/rolter-proxy:dev .
# The final image is distroless (no shell, no curl), so it has no HEALTHCHECK:
# the binary has no probe mode, and health is checked by the orchestrator
# instead (HTTP GET /healthz for liveness and /readyz for readiness on --listen :8080).

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# The whole repository: go.work names every module of the workspace.
COPY . .
RUN --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=cache,target=/go/pkg/mod \
    cd dataplane && go build -trimpath -ldflags="-s -w" -o /out/rolter-proxy ./cmd/rolter-proxy
# The --snapshot-cache and --routing-state directory, owned by the runtime
# user (nonroot, 65532), so that a volume mounted there starts writable.
RUN mkdir -p /out/state

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rolter-proxy /usr/local/bin/rolter-proxy
COPY --from=build --chown=65532:65532 /out/state /var/lib/rolter
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/rolter-proxy"]
