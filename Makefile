# rolter — run `make help` for the targets.
SHELL := /bin/bash
MODULES := pkg dataplane controlplane kvwatcher proto tests
BIN := bin
GO ?= go
FUZZTIME ?= 20s
# make test runs every module's tests with the race detector.
TESTFLAGS ?= -race -count=1 -timeout 10m

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

.PHONY: build
build: ## Build every binary into bin/
	@mkdir -p $(BIN)
	cd dataplane && $(GO) build -o ../$(BIN)/rolter-proxy ./cmd/rolter-proxy
	cd controlplane && $(GO) build -o ../$(BIN)/rolter-controlplane ./cmd/rolter-controlplane
	cd controlplane && $(GO) build -o ../$(BIN)/rolterctl ./cmd/rolterctl
	cd kvwatcher && $(GO) build -o ../$(BIN)/rolter-kvwatcher ./cmd/rolter-kvwatcher
	cd tests && $(GO) build -o ../$(BIN)/vllmsim ./cmd/vllmsim
	cd tests && $(GO) build -o ../$(BIN)/rolter-sim ./cmd/rolter-sim

.PHONY: proto
proto: ## Regenerate proto/'s Go code with buf and the plugins pinned in tools/go.mod
	@mkdir -p $(BIN)/tools
	cd tools && $(GO) build -o ../$(BIN)/tools/ github.com/bufbuild/buf/cmd/buf google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc
	cd proto && PATH="$(CURDIR)/$(BIN)/tools:$$PATH" buf lint && PATH="$(CURDIR)/$(BIN)/tools:$$PATH" buf generate
	cd proto && { echo "# Written by make proto. TestGeneratedCodeIsFresh fails when a file below changed since."; \
		find . -name '*.proto' -o -name buf.gen.yaml | sed 's|^\./||' | LC_ALL=C sort | xargs sha256sum; } > genstamp.txt

.PHONY: deps
deps: ## Install what the tests need that this machine lacks (redis-server)
	@./scripts/install-deps.sh

.PHONY: test
test: deps ## Install test dependencies, then run every test of every module (with -race)
	@set -e; for m in $(MODULES); do echo "== $$m"; (cd $$m && $(GO) test $(TESTFLAGS) ./...); done

.PHONY: test-unit
test-unit: ## Run the tests of pkg and dataplane only (fast)
	@set -e; for m in pkg dataplane; do (cd $$m && $(GO) test -count=1 ./...); done

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (default 20s) each
	@./scripts/fuzz-all.sh $(FUZZTIME)

.PHONY: bench
bench: ## Run the Go benchmarks of every module (numbers, not pass/fail)
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) test -run '^$$' -bench . -benchmem ./...); done

.PHONY: bench-proxy
bench-proxy: ## Proxy overhead: direct vs a tuned httputil.ReverseProxy vs rolter-proxy vs Portkey (npm ci in tests/tools/portkey), wrk at 8/32/64
	cd tests && $(GO) run ./cmd/bench-proxy

.PHONY: slow-clients
slow-clients: ## 1,000 trickling connections against a proxy: ordinary requests still served (docs/operations.md)
	cd tests && $(GO) run ./cmd/slow-clients

.PHONY: sim
sim: ## Build the routing simulator and compare the strategies on gsp (see docs/routing.md)
	@mkdir -p $(BIN)
	cd tests && $(GO) build -o ../$(BIN)/rolter-sim ./cmd/rolter-sim
	./$(BIN)/rolter-sim --workload gsp --capacity 2048 --strategies all

.PHONY: run
run: build ## Start a control plane (embedded etcd), a kvwatcher (embedded NATS), 3 simulated vLLM replicas and two proxies following it; Ctrl-C stops all
	@./scripts/run.sh

IMAGE_REPO ?= rolter
IMAGE_TAG  ?= dev

.PHONY: images
images: ## Build the container images (needs a Docker engine with BuildKit)
	DOCKER_BUILDKIT=1 docker build -f deploy/docker/controlplane.Dockerfile -t $(IMAGE_REPO)/rolter-controlplane:$(IMAGE_TAG) .
	DOCKER_BUILDKIT=1 docker build -f deploy/docker/dataplane.Dockerfile    -t $(IMAGE_REPO)/rolter-proxy:$(IMAGE_TAG) .
	DOCKER_BUILDKIT=1 docker build -f deploy/docker/kvwatcher.Dockerfile    -t $(IMAGE_REPO)/rolter-kvwatcher:$(IMAGE_TAG) .
	DOCKER_BUILDKIT=1 docker build -f deploy/docker/rolterctl.Dockerfile    -t $(IMAGE_REPO)/rolterctl:$(IMAGE_TAG) .
	DOCKER_BUILDKIT=1 docker build -f deploy/docker/vllmsim.Dockerfile      -t $(IMAGE_REPO)/vllmsim:$(IMAGE_TAG) .

.PHONY: vet
vet: ## go vet every module
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) vet ./...); done

.PHONY: fmt
fmt: ## gofmt every module
	gofmt -w $(MODULES)

.PHONY: tidy
tidy: ## go mod tidy every module
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) mod tidy); done

.PHONY: lint
lint: ## staticcheck every module (the version pinned in tools/go.mod)
	@mkdir -p $(BIN)/tools
	cd tools && $(GO) build -o ../$(BIN)/tools/ honnef.co/go/tools/cmd/staticcheck
	@set -e; for m in $(MODULES); do (cd $$m && ../$(BIN)/tools/staticcheck ./...); done

.PHONY: verify
verify: ## Fail if code is unformatted, untidy, or fails vet or staticcheck
	@test -z "$$(gofmt -l $(MODULES))" || (gofmt -l $(MODULES); echo "run make fmt"; exit 1)
	@$(MAKE) --no-print-directory tidy vet lint
	@git diff --exit-code -- '*.mod' '*.sum' || (echo "go.mod/go.sum untidy: run make tidy"; exit 1)

.PHONY: clean
clean: ## Remove build output
	rm -rf $(BIN)
