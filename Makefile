GO ?= go

.PHONY: test vet fmt-check build bench

# test is the one command CI and newcomers run: vet, formatting, then every test under -race.
test: vet fmt-check
	$(GO) test -race -count=1 ./...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

build:
	$(GO) build -o cacheroute ./cmd/cacheroute

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
