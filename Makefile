# sockmesh: see README.md. gateway-api v1.7.0 needs Go 1.27; the module proxy
# serves the toolchain, so a machine with any Go >= 1.21 fetches it itself.
export GOTOOLCHAIN := go1.27.4
GO ?= go

.PHONY: all generate build test test-unit bench demo e2e-cluster clean k8s-binaries

all: build

# Regenerate the bpf2go output (needs clang, llvm-strip and libbpf-dev);
# datapath's TestGeneratedObjectIsFresh fails when the committed output is stale.
generate:
	$(GO) generate ./datapath/...

build:
	$(GO) build -o bin/ ./cmd/...

# Everything CI runs. Privileged tests need root; SOCKMESH_REQUIRE_PRIVILEGED=1
# turns their skips into failures.
test:
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 60m ./...

# Build kube-apiserver, etcd and the other Kubernetes components the
# integration and cluster tests run, from the Go module proxy, into
# ${SOCKMESH_CACHE:-/var/cache/sockmesh} (only what is missing; a cold build
# takes 5-12 minutes on 2 cores). See test/cluster/build-binaries.sh.
k8s-binaries:
	test/cluster/build-binaries.sh all

# Benchmarks, as root. The datapath one compares direct, iptables REDIRECT
# and eBPF redirect (flags: -rounds, -duration, -parallel).
bench:
	$(GO) run ./test/bench/datapath
	if [ -d test/bench/cmd/benchall ]; then $(GO) run ./test/bench/cmd/benchall; fi

clean:
	rm -rf bin
