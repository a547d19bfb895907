# syntax=docker/dockerfile:1
# vllmsim: built from the Go workspace at the repository root.
#   docker build -f deploy/docker/vllmsim.Dockerfile -t rolter/vllmsim:dev .
# The final image is distroless (no shell, no curl), so it has no HEALTHCHECK:
# the binary has no probe mode, and health is checked by the orchestrator
# instead (HTTP GET /health on --listen :8000; KV events on 5557, replay on 5558).

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# The whole repository: go.work names every module of the workspace.
COPY . .
RUN --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=cache,target=/go/pkg/mod \
    cd tests && go build -trimpath -ldflags="-s -w" -o /out/vllmsim ./cmd/vllmsim

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/vllmsim /usr/local/bin/vllmsim
USER nonroot:nonroot
EXPOSE 8000 5557 5558
ENTRYPOINT ["/usr/local/bin/vllmsim"]
