GO ?= go

# Tools the tests run besides Go, built from the Go module proxy into .bin (see `make tools`).
BIN := $(CURDIR)/.bin
HELM_VERSION ?= v3.22.0
HELM := $(BIN)/helm

.PHONY: test vet fmt-check build version-ldflags bench tools poison

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

# The source revision, given to the linker: `go build` stamps it by itself only in a git clone
# (not in a git worktree, nor with -buildvcs=false) and `go run` not at all, so the binary would
# not know what it was built from. `cacheroute version` prints it.
REVISION := $(shell git rev-parse HEAD 2>/dev/null)
REVISION_TIME := $(shell TZ=UTC git show -s --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ HEAD 2>/dev/null)
REVISION_MODIFIED := $(shell test -n "$$(git status --porcelain 2>/dev/null)" && echo true)
VERSION_PKG := github.com/cacheroute/cacheroute/internal/cli
VERSION_LDFLAGS := -X $(VERSION_PKG).sourceRevision=$(REVISION) -X $(VERSION_PKG).sourceTime=$(REVISION_TIME) -X $(VERSION_PKG).sourceModified=$(REVISION_MODIFIED)

# build writes the binary to $(OUT), ./cacheroute by default.
OUT ?= cacheroute
build:
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -o $(OUT) ./cmd/cacheroute

# version-ldflags prints the linker flags that record the revision, for other builds:
#   go run -ldflags "$(make -s version-ldflags)" ./cmd/cacheroute version
version-ldflags:
	@echo '$(VERSION_LDFLAGS)'

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
