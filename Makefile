# Model Orchestra — `make help` lists the targets.

VERSION ?= 1.0.0
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

ROOT := $(abspath .)
BIN_DIR := $(ROOT)/bin
OUT := $(ROOT)/_output
export MO_BIN_DIR := $(BIN_DIR)
export PATH := $(BIN_DIR):$(PATH)

GO ?= go
LDFLAGS := -s -w -X github.com/model-orchestra/operator/internal/version.Version=$(VERSION)
IMAGE_REPO := ghcr.io/model-orchestra
# The project's images: exactly the images the charts and the operator reference.
BINARIES := orchestra-operator orchestra-gateway orchestra-dispatcher orchestra-fetch orchestra-sim orchestra-agent
IMAGES := $(BINARIES) nats-server
GO_TEST_FLAGS ?= -count=1 -timeout 40m
# Wakes measured by bench-lifecycle: with 15 the p99 is the slowest one.
BENCH_ROUNDS ?= 15
# Rounds and the larger generated model of bench-engine.
BENCH_ENGINE_ROUNDS ?= 3
BENCH_ENGINE_LARGE ?= 256MiB
# Wakes from zero, and as many plain scales, a model and round of bench-engine.
BENCH_ENGINE_WAKES ?= 3
# BENCH_ENGINE_TTFT=1: bench-engine measures only the first token (tiny
# model; direct, one and three relay pods, gateway + queue): minutes.
BENCH_ENGINE_TTFT ?= 0
# The pinned tools each target runs; `make tools` builds them all.
RUN_TOOLS := etcd kubernetes coredns
# The real engine's image (make images): the pinned Ollama of
# hack/tools/ollama, built once per pin; OLLAMA_IMAGE=0 leaves it out.
OLLAMA_VERSION := $(shell awk '$$1 == "github.com/ollama/ollama" {print $$2}' hack/tools/ollama/go.mod)
OLLAMA_IMAGE ?= 1
TEST_TOOLS := etcd kubernetes kwok coredns helm olm opm

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} \
		/^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } \
		/^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: tools
tools: ## Build the pinned tools (Kubernetes, etcd, kwok, CoreDNS, helm, controller-gen, golangci-lint, helm-operator-plugins, Ollama, OLM v0, opm) into bin/, once per pin.
	hack/tools/install.sh

.PHONY: build
build: ## Build every project binary into _output/bin/.
	@mkdir -p $(OUT)/bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(OUT)/bin/ $(addprefix ./cmd/,$(BINARIES)) ./cmd/orchestra ./cmd/devcluster

.PHONY: images
images: ## Build every chart image as a docker-archive tarball in _output/images/ (no Docker engine needed), and the Ollama image (OLLAMA_IMAGE=0: without it).
	@mkdir -p $(OUT)/linux $(OUT)/images
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(OUT)/linux/ $(addprefix ./cmd/,$(BINARIES))
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags "-s -w" -o $(OUT)/linux/nats-server github.com/nats-io/nats-server/v2
	$(GO) build -o $(OUT)/bin/devcluster ./cmd/devcluster
	for img in $(IMAGES); do \
		$(OUT)/bin/devcluster image --binary $(OUT)/linux/$$img --ref $(IMAGE_REPO)/$$img:v$(VERSION) --out $(OUT)/images/$$img.tar; \
	done
ifneq ($(OLLAMA_IMAGE),0)
	@hack/tools/install.sh ollama
	@# The chart runs Ollama from a shell script (the model import, warm-up,
	@# waiting for the cache): busybox's static sh (its applets built in)
	@# is /bin/sh, and ollama is on the PATH (set, as the upstream image does:
	@# the runtime sets none) where the upstream image has it.
	@[ -x /bin/busybox ] || { echo "images: the ollama image needs /bin/busybox: apt-get install busybox-static (hack/setup-node.sh installs it)"; exit 1; }
	@if [ ! -f $(OUT)/images/ollama.tar ] || [ $(BIN_DIR)/ollama -nt $(OUT)/images/ollama.tar ] || [ Makefile -nt $(OUT)/images/ollama.tar ]; then \
		$(OUT)/bin/devcluster image --binary $(BIN_DIR)/ollama --path /usr/bin/ollama --file /bin/sh=/bin/busybox \
			--ref $(IMAGE_REPO)/ollama:$(OLLAMA_VERSION) --out $(OUT)/images/ollama.tar \
			--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
			--env HOME=/tmp --env OLLAMA_HOST=0.0.0.0:11434 --env GIN_MODE=release --port 11434 --arg serve; \
	fi
endif

.PHONY: test-unit
test-unit: ## Every test that needs no cluster, in seconds (go test -short); needs no tools.
	$(GO) test -short ./...

.PHONY: test
test: ## Every test tier: unit, control plane, real node and end to end (as root), golden files. Installs the real node's Debian packages and a criu that works on this kernel first (as root).
	@MO_SETUP_FOR="make test" hack/setup-node.sh --if-root
	@hack/setup-criu.sh --if-root
	@hack/tools/install.sh $(TEST_TOOLS)
	@$(MAKE) --no-print-directory images
	$(GO) test $(GO_TEST_FLAGS) ./...

.PHONY: lint
lint: ## gofmt, go vet, a 32-bit build (GOARCH=386: syscall field widths differ) and golangci-lint.
	@hack/tools/install.sh golangci-lint
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	GOARCH=386 $(GO) build ./...
	$(BIN_DIR)/golangci-lint run ./...

.PHONY: run
run: ## The demo: a local real-node cluster (root), the operator, a ModelOrchestra serving the simulator and the real Ollama engine, and a streamed answer from each through its gateway (MODEL=~/models/x.gguf: Ollama serves your GGUF file). Installs the real node's Debian packages first.
	@MO_SETUP_FOR="make run" hack/setup-node.sh
	@hack/tools/install.sh $(RUN_TOOLS)
	@$(MAKE) --no-print-directory images
	$(GO) run ./cmd/devcluster status >/dev/null 2>&1 || $(GO) run ./cmd/devcluster up --images $(OUT)/images
	$(GO) run ./hack/demo up $(if $(MODEL),--model "$(MODEL)")

.PHONY: down
down: ## Remove the demo and the local cluster, and clean the machine.
	-$(GO) run ./hack/demo down
	$(GO) run ./cmd/devcluster down

.PHONY: generate
generate: ## Regenerate the CRD and deep-copy code from api/ with controller-gen.
	@hack/tools/install.sh controller-gen
	$(BIN_DIR)/controller-gen object paths=./api/...
	$(BIN_DIR)/controller-gen crd paths=./api/... output:crd:artifacts:config=config/crd/bases

.PHONY: verify
verify: generate ## Regenerate everything generated (CRD, bundle, catalog, golden files) and fail on any diff.
	$(MAKE) bundle catalog
	$(GO) test ./internal/orchestra/preview -run Golden -update >/dev/null
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@$(GO) mod tidy -diff || { echo "verify: go.mod or go.sum is not tidy (the diff above): run go mod tidy"; exit 1; }
	@git diff --exit-code --stat || { echo "verify: generated files drifted from their sources (see the diff above)"; exit 1; }

##@ OLM delivery

OLM := $(GO) run ./hack/olm

.PHONY: bundle
bundle: ## Generate bundle/, bundle.Dockerfile, config/rbac/role.yaml and the install chart's files/ for VERSION.
	$(OLM) bundle --version $(VERSION)

.PHONY: validate-bundle
validate-bundle: ## Validate the bundles with operator-framework/api (operator-sdk bundle validate --select-optional suite=operatorframework) and our rules.
	$(OLM) validate-bundle bundle $(wildcard catalog/bundles/*) $(wildcard catalog/carriers/*)

.PHONY: catalog
catalog: ## Generate the CRD carriers (catalog/carriers.yaml) and render catalog/semver-template.yaml into the File-Based Catalogs catalog/configs (bundle images) and catalog/inline (no bundle images) with operator-registry's semver template.
	$(OLM) catalog

.PHONY: validate-catalog
validate-catalog: ## Validate both catalogs with operator-registry's opm validate check.
	$(OLM) validate-catalog catalog/configs
	$(OLM) validate-catalog catalog/inline

.PHONY: check-crd-compat
check-crd-compat: ## Refuse CRD changes OLM would refuse, against every earlier release, and any catalog bundle pair whose install in either order would drop a field.
	$(OLM) check-crd-compat

##@ Benchmarks (each prints a table and updates its section of docs/benchmarks.md)

.PHONY: bench-fetch
bench-fetch: ## Model fetcher throughput vs curl on a 2 GiB loopback repository, sha256 on and off.
	$(GO) run ./hack/bench-fetch --size 2GiB

.PHONY: bench-dataplane
bench-dataplane: ## Latency the gateway, queue and dispatcher add over the simulator (p50/p99 at concurrency 1, 16, 64) and max requests/s.
	$(GO) run ./hack/bench-dataplane -docs docs/benchmarks.md

.PHONY: bench-dataplane-ollama
bench-dataplane-ollama: ## First token and tokens/s of a real ollama serve (the pinned build) direct, through a plain reverse proxy and through gateway + JetStream + dispatcher in one process, interleaved.
	$(GO) test ./internal/dataplanetest -run TestOllamaHopBenchmark -ollama-hop-bench -ollama-hop-docs $(CURDIR)/docs/benchmarks.md -v -count=1 -timeout 10m

.PHONY: bench-routing
bench-routing: ## Routing (least-loaded, random, CHWBL, prefix; 1 and 2 dispatchers) on 4 simulators with prefix caches: multi-turn chat with shared system prompts and a no-sharing workload, interleaved; TTFT p50/p90, tokens/s, hit rate, imbalance.
	$(GO) run ./hack/bench-routing -rounds 3 -docs docs/benchmarks.md
	$(GO) test ./internal/dataplanetest -run TestOllamaRoutingBenchmark -ollama-routing-bench -ollama-routing-rounds 4 -ollama-routing-docs $(CURDIR)/docs/benchmarks.md -v -count=1 -timeout 30m
	$(GO) test ./internal/dataplanetest -run TestOllamaRoutingBenchmark -ollama-routing-bench -ollama-routing-rounds 8 -ollama-routing-conversations 6 -ollama-routing-marker bench-routing-ollama-light -ollama-routing-docs $(CURDIR)/docs/benchmarks.md -v -count=1 -timeout 30m

.PHONY: bench-tiers
bench-tiers: ## Wake from the hot (huge-page tmpfs), warm (disk) and cold tiers vs memcpy, fresh memory, tmpfs, O_DIRECT disk and S3-fake bandwidth, 0.25/1/4 GiB (root mounts the tmpfs).
	@hack/setup-criu.sh --if-root
	flock /tmp/mo-bench.lock $(GO) run ./hack/bench-tiers --sizes 0.25GiB,1GiB,4GiB -docs docs/benchmarks.md

.PHONY: bench-tiers-ollama
bench-tiers-ollama: ## The real Ollama engine's first token after loading a generated GGUF model (BENCH_OLLAMA_TIERS_SIZE, default 256MiB) from a hot, warm and cold copy vs the tier probe of the same file (root mounts the tmpfs).
	@hack/tools/install.sh ollama
	flock /tmp/mo-bench.lock $(GO) test ./hack/bench-tiers -run TestOllamaTiersBenchmark -ollama-tiers-bench -ollama-tiers-size $(or $(BENCH_OLLAMA_TIERS_SIZE),256MiB) -ollama-tiers-docs $(CURDIR)/docs/benchmarks.md -v -count=1 -timeout 30m

.PHONY: bench-tiers-ollama-zero
bench-tiers-ollama-zero: tools images ## A parked real Ollama application woken from zero with its verified hot copy, a warm copy, or no copy on the node (real-node cluster, root), interleaved; BENCH_ZERO_COPY_ROUNDS (default 3), BENCH_OLLAMA_TIERS_SIZE (default 256MiB).
	$(GO) test ./internal/e2e -run TestZeroCopyBenchmark -zero-copy-bench -zero-copy-rounds $(or $(BENCH_ZERO_COPY_ROUNDS),3) -zero-copy-size $(or $(BENCH_OLLAMA_TIERS_SIZE),256MiB) -zero-copy-docs docs/benchmarks.md -v -count=1 -timeout 60m

.PHONY: bench-mux
bench-mux: ## Seat-group swaps (4 applications, 1 seat, a device with room for 1) vs the hot tier's probes read between turns, 0.25/1 GiB; requests lost, swaps with requests in flight.
	flock /tmp/mo-bench.lock $(GO) run ./hack/bench-mux --sizes 0.25GiB,1GiB -docs docs/benchmarks.md

.PHONY: soak
soak: ## Mixed load through the in-process data plane for SOAK (default 1h), a fault every SOAK_FAULT_EVERY (3m), profiles into SOAK_PROFILES (a directory); not in CI.
	ORCHESTRA_SOAK=$(or $(SOAK),1h) ORCHESTRA_SOAK_FAULT_EVERY=$(or $(SOAK_FAULT_EVERY),3m) ORCHESTRA_SOAK_PROFILES=$(SOAK_PROFILES) $(GO) test ./internal/dataplanetest -run '^TestSoak$$' -count=1 -v -timeout 3h

.PHONY: bench-lifecycle
bench-lifecycle: tools images ## Wake from zero (real-node cluster, root; BENCH_ROUNDS wakes, default 15), then the checkpoint tiers (bench-tiers); BENCH_TIERS=0 runs the first alone.
	$(GO) test ./internal/e2e -run TestWakeBenchmark -lifecycle-bench -lifecycle-bench-rounds $(BENCH_ROUNDS) -lifecycle-bench-docs docs/benchmarks.md -v -count=1 -timeout 150m
	$(if $(filter 0,$(BENCH_TIERS)),,$(MAKE) bench-tiers)

.PHONY: bench-engine
bench-engine: tools images ## The real Ollama engine on two generated models (real-node cluster, root): wake from zero vs a plain scale, sleep -> wake vs cold, gateway + queue vs direct. BENCH_ENGINE_ROUNDS (default 3), BENCH_ENGINE_WAKES (default 3 a round), BENCH_ENGINE_LARGE (default 256MiB), BENCH_ENGINE_TTFT=1 (first token only).
	flock /tmp/mo-bench.lock $(GO) test ./internal/e2e -run TestEngineBenchmark -engine-bench -engine-bench-rounds $(BENCH_ENGINE_ROUNDS) -engine-bench-wakes $(BENCH_ENGINE_WAKES) -engine-bench-large $(BENCH_ENGINE_LARGE) -engine-bench-ttft=$(BENCH_ENGINE_TTFT) -engine-bench-docs docs/benchmarks.md -v -count=1 -timeout 90m

.PHONY: bench-reconcile
bench-reconcile: tools ## 50 and 200 custom resources to Deployed, CPU per no-op reconcile, RSS: ours and helm-operator-plugins (default and tuned), interleaved, with ratios.
	$(GO) run ./hack/bench-reconcile -n 50,200 -rounds 2 -docs docs/benchmarks.md
