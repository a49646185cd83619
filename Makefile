GO ?= go

# Tools the tests run besides Go, built from the Go module proxy into .bin (see `make tools`).
BIN := $(CURDIR)/.bin
HELM_VERSION ?= v3.22.0
HELM := $(BIN)/helm

.PHONY: test vet fmt-check build bench tools poison

# test is the one command CI and newcomers run: the tools, vet, formatting, then every test under
# -race (the deploy/ tests lint and render the Helm chart with the helm of `make tools`), then the
# listener's tests again in the poison build.
test: tools vet fmt-check
	HELM=$(HELM) $(GO) test -race -count=1 ./...
	$(MAKE) poison

# poison runs the proxy and router tests in a build that overwrites each request's buffers once
# its handler returns (internal/proxy/poison.go), so a value kept without a copy fails a test at
# once instead of by chance.
poison:
	$(GO) test -tags cacheroute_poison -count=1 ./internal/proxy/ ./internal/router/

# tools installs helm $(HELM_VERSION) into .bin, once: `go install` from the module proxy, so a
# fresh machine needs nothing but Go (about 5 minutes cold, measured on a 2-core machine).
tools:
	@if [ ! -x "$(HELM)" ] || [ "$$(cat "$(BIN)/helm.version" 2>/dev/null)" != "$(HELM_VERSION)" ]; then \
		echo "installing helm $(HELM_VERSION) into $(BIN)"; \
		GOBIN="$(BIN)" $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) && \
		echo "$(HELM_VERSION)" > "$(BIN)/helm.version"; \
	fi

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

build:
	$(GO) build -o cacheroute ./cmd/cacheroute

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
