# syntax=docker/dockerfile:1
# rolter-controlplane: built from the Go workspace at the repository root.
#   docker build -f deploy/docker/controlplane.Dockerfile -t rolter/rolter-controlplane:dev .
# The final image is distroless (no shell, no curl), so it has no HEALTHCHECK:
# the binary has no probe mode, and health is checked by the orchestrator
# instead (gRPC 7070: a TCP check; with --metrics-listen :9464, HTTP GET /metrics).

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# The whole repository: go.work names every module of the workspace.
COPY . .
RUN --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=cache,target=/go/pkg/mod \
    cd controlplane && go build -trimpath -ldflags="-s -w" -o /out/rolter-controlplane ./cmd/rolter-controlplane

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rolter-controlplane /usr/local/bin/rolter-controlplane
USER nonroot:nonroot
EXPOSE 7070 9464
ENTRYPOINT ["/usr/local/bin/rolter-controlplane"]
