# sockmesh: see README.md. gateway-api v1.7.0 needs Go 1.27; the module proxy
# serves the toolchain, so a machine with any Go >= 1.21 fetches it itself.
export GOTOOLCHAIN := go1.27.4
GO ?= go

.PHONY: all generate build test test-unit bench demo e2e-cluster clean

all: build

# Regenerate the bpf2go output (needs clang, llvm-strip and libbpf-dev).
generate:
	$(GO) generate ./datapath/...

build:
	$(GO) build -o bin/ ./cmd/...

# Everything CI runs. Privileged tests need root; SOCKMESH_REQUIRE_PRIVILEGED=1
# turns their skips into failures.
test:
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 60m ./...

bench:
	$(GO) run ./test/bench/cmd/benchall

clean:
	rm -rf bin
