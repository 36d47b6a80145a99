# Boxcar. The two commands: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
export PATH := $(shell $(GO) env GOPATH)/bin:$(PATH)

.PHONY: all build demo test test-short lint deps deps-test bench clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/ ./cmd/worker ./cmd/submit ./cmd/demo-model

## deps: what a job needs at run time (bubblewrap, python3 for the example profile)
deps:
	@scripts/deps.sh runtime

## deps-test: also the servers the tests start (versitygw, prometheus)
deps-test:
	@scripts/deps.sh test

## demo: one real job end to end on the embedded defaults
demo: deps build
	@scripts/demo.sh

## test: the full suite CI runs, against real servers
test: deps-test
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) test -race -count=1 -timeout 30m ./...
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 20s ./internal/job

test-short:
	$(GO) test -short -count=1 ./...

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

bench: deps-test
	$(GO) test -run '^$$' -bench . -benchtime 200x -count 3 ./internal/...

clean:
	rm -rf $(BIN)
