# Boxcar. The two commands: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The version goes into every manifest (worker.version) and `--version`; -buildvcs=auto stamps
# the VCS revision even where GOFLAGS turns it off, and skips it outside a git checkout.
LDFLAGS := -X github.com/boxcar-run/boxcar/internal/provenance.releaseVersion=$(VERSION)
BUILDFLAGS := -trimpath -buildvcs=auto
export PATH := $(shell $(GO) env GOPATH)/bin:$(PATH)
# The race detector writes its reports here, not into the tests' output, so that a failing run
# ends with them (CI keeps the end of the output).
RACE_LOGS := $(CURDIR)/.boxcar/race

.PHONY: all build demo test test-faults lint deps deps-test bench clean image test-cluster

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build $(BUILDFLAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/worker ./cmd/submit ./cmd/demo-model

## deps: what a job needs at run time (bubblewrap, python3 for the example profile)
deps:
	@scripts/deps.sh runtime

## deps-test: also the servers the tests start (versitygw, prometheus)
deps-test:
	@scripts/deps.sh test

## demo: one real job end to end on the embedded defaults
demo: deps build
	@scripts/demo.sh

## test: the full suite CI runs, against real servers: the fast tier (plain `go test ./...`) and
## the tests behind the integration build tag (bubblewrap, versitygw, promtool, Docker, root).
## Every benchmark also runs once (-benchtime 1x, in the same test binaries, so nothing more is
## built): a smoke test that keeps make bench working; its figures mean nothing under -race.
## Then the fuzzers of what a worker reads (a job) and of what it signs (the manifest's canonical
## form, against the JCS reference, and its writer, against encoding/json), each minimizing a new input for at most 1 s: the default 60 s
## took all but the first 3 s of a 20 s run.
test: deps-test image
	$(GO) vet -tags integration ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	@rm -rf $(RACE_LOGS) && mkdir -p $(RACE_LOGS)
	GORACE="log_path=$(RACE_LOGS)/report" $(GO) test -tags integration -race -count=1 -timeout 30m -bench . -benchtime 1x ./... \
		|| { scripts/race-reports.sh $(RACE_LOGS); exit 1; }
	GORACE="log_path=$(RACE_LOGS)/report" $(GO) test -tags integration -race -count=1 ./internal/runner -args -publish-pause 1s \
		|| { scripts/race-reports.sh $(RACE_LOGS); exit 1; }
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 20s -fuzzminimizetime 1s ./internal/job
	$(GO) test -run '^$$' -fuzz '^FuzzStatusAppendJSONMatchesMarshal$$' -fuzztime 15s -fuzzminimizetime 1s ./internal/job
	$(GO) test -run '^$$' -fuzz '^FuzzCanonicalMatchesJCS$$' -fuzztime 15s -fuzzminimizetime 1s ./internal/provenance
	$(GO) test -run '^$$' -fuzz '^FuzzCanonicalStringsMatchJCS$$' -fuzztime 15s -fuzzminimizetime 1s ./internal/provenance
	$(GO) test -run '^$$' -fuzz '^FuzzEncoderMatchesMarshal$$' -fuzztime 15s -fuzzminimizetime 1s ./internal/provenance
	@$(MAKE) --no-print-directory test-cluster

## test-faults: the fault-injection runs (docs/testing.md): external nats-server and versitygw, two
## workers, 200 jobs while workers, NATS and the store are killed, paused and restarted; then a
## 3-node JetStream cluster whose nodes are killed one at a time under 200 `submit run`s
test-faults: deps-test build
	@scripts/install-nats-server.sh
	$(GO) run -tags faults ./test/faults --bin $(BIN)
	$(GO) run -tags faults ./test/faults --bin $(BIN) --cluster

GOLANGCI_LINT_VERSION := v2.15.0

## lint: gofmt, go vet, golangci-lint (.golangci.yml; with and without the integration tag, and the
## test cluster's module test/cluster), shellcheck
lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags integration ./...
	@scripts/golangci-lint.sh $(GOLANGCI_LINT_VERSION)
	@scripts/shellcheck.sh

## bench: Boxcar against its primitives, side by side (docs/performance.md); raw output in bin/bench.txt
bench: deps-test
	@GO=$(GO) scripts/bench.sh

## image: the worker's release image (FROM scratch, static binaries, uid 65532), no registry needed;
## also saved as bin/image.tar for the test cluster
IMAGE ?= ghcr.io/boxcar-run/boxcar:$(VERSION)
image:
	@test -s /etc/ssl/certs/ca-certificates.crt || { echo "image: no /etc/ssl/certs/ca-certificates.crt; run  apt-get install -y ca-certificates" >&2; exit 1; }
	@rm -rf $(BIN)/image && mkdir -p $(BIN)/image
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -ldflags '-s -w $(LDFLAGS)' -o $(BIN)/image/ ./cmd/worker ./cmd/submit
	cp /etc/ssl/certs/ca-certificates.crt $(BIN)/image/
	@printf 'root:x:0:0:root:/root:/sbin/nologin\nboxcar:x:65532:65532:boxcar:/tmp:/sbin/nologin\n' >$(BIN)/image/passwd
	@printf 'root:x:0:\nboxcar:x:65532:\n' >$(BIN)/image/group
	@scripts/docker.sh
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .
	@docker image inspect $(IMAGE) --format 'image: {{index .RepoTags 0}} {{.Size}} bytes, user {{.Config.User}}, entrypoint {{.Config.Entrypoint}}'
	@# The test cluster imports the archive into its containerd: a pod runs the image, no registry.
	docker save -o $(BIN)/image.tar $(IMAGE)
	@echo '$(IMAGE) $(VERSION)' >$(BIN)/image.ref # what the container tests run; they build nothing

## test-cluster: the Kubernetes backend on a real single-node cluster; needs root. Builds
## Kubernetes once into BOXCAR_CLUSTER_CACHE (default ~/.cache/boxcar-cluster), ~12 min cold.
## One cluster per machine: runs wait on /tmp/boxcar-cluster.lock.
test-cluster: image
	@test/cluster/build.sh
	@scripts/docker.sh
	@# go test with no package (its commands have no tests) runs in local directory mode, which
	@# streams the output, so the figures TestMain prints last (pod start, Helm, KEDA scaling) show;
	@# with a package list it would keep a passing run's output to itself.
	cd test/cluster && $(GO) vet ./... && flock /tmp/boxcar-cluster.lock $(GO) test -count=1 -timeout 40m

clean:
	rm -rf $(BIN)
