# syntax=docker/dockerfile:1
# rolterctl: built from the Go workspace at the repository root.
#   docker build -f deploy/docker/rolterctl.Dockerfile -t rolter/rolterctl:dev .
# The final image is distroless (no shell, no curl), so it has no HEALTHCHECK:
# the binary has no probe mode, and health is checked by the orchestrator
# instead (it is a one-shot command line tool; its exit code is the check).

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
# The whole repository: go.work names every module of the workspace.
COPY . .
RUN --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=cache,target=/go/pkg/mod \
    cd controlplane && go build -trimpath -ldflags="-s -w" -o /out/rolterctl ./cmd/rolterctl

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rolterctl /usr/local/bin/rolterctl
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/rolterctl"]
