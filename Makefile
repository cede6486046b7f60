# sockmesh: see README.md. gateway-api v1.7.0 needs Go 1.27; the module proxy
# serves the toolchain, so a machine with any Go >= 1.21 fetches it itself.
export GOTOOLCHAIN := go1.27.4
GO ?= go

# Under sudo (the README's `sudo make demo`, `sudo make test`) everything
# runs as root, and root must write nothing in the home of the user who ran
# sudo: a directory it creates there (~/.cache, ~/go, ~/.config/go,
# kubectl's ~/.kube) stays root's, and that user's next `make build` or
# `make test` cannot write their Go caches. Handing such files back after
# the fact misses a target that fails or is interrupted; so root runs with
# a home of its own, its caches its own, as plain sudo gives it, also under
# `sudo -E` or a sudoers that keeps HOME: the Go variables that would still
# lead into the user's directories are not passed on.
ifneq ($(SUDO_UID),)
ifeq ($(shell id -u),0)
export HOME := $(shell echo ~root)
unexport GOCACHE GOMODCACHE GOPATH GOENV XDG_CACHE_HOME XDG_CONFIG_HOME
endif
endif

.PHONY: all generate build lint test bench demo e2e-cluster e2e-cluster-clean clean k8s-binaries handback

all: build

# Regenerate the bpf2go output (needs clang, llvm-strip and libbpf-dev);
# datapath's TestGeneratedObjectIsFresh fails when the committed output is stale.
generate:
	$(GO) generate ./datapath/...

# The version the binaries report (sockmesh version, sockmesh_build_info).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

build:
	$(call handing-back,$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/ ./cmd/...)

# sockmesh on its embedded default, as root: a client "pod", a TLS backend
# "pod" and the agent with the file source on examples/demo, in network
# namespaces it removes again (also on Ctrl-C). See test/demo.
demo: build
	$(call handing-back,$(GO) build -o bin/sockmesh-demo ./test/demo)
	./bin/sockmesh-demo -bin bin -manifests examples/demo

# What a build under sudo writes in the checkout, bin/, goes back to the
# user who ran sudo ($SUDO_UID, $SUDO_GID), or their next `make build`
# cannot write bin/. Without sudo it does nothing.
HANDBACK = if [ -n "$$SUDO_UID" ] && [ "$$(id -u)" = 0 ] && [ -d bin ]; then \
	find bin -user 0 -exec chown -h "$$SUDO_UID:$${SUDO_GID:-$$SUDO_UID}" {} + || exit 1; \
fi
handback:
	@$(HANDBACK)

# $(call handing-back,COMMAND) runs COMMAND, a build writing in bin/, and
# HANDBACK after it however it ends: a build that fails (one package does
# not compile, the others linked) or that Ctrl-C interrupts leaves bin/
# root's otherwise. The shell's EXIT trap runs it, and the shell exits with
# COMMAND's status (130 when interrupted: dash runs no EXIT trap on a
# signal it does not trap). make echoes COMMAND alone.
handing-back = @echo '$(1)'; trap '$(HANDBACK)' EXIT; trap 'exit 130' INT TERM; $(1)

# Static checks: gofmt, vet, staticcheck, and no function that neither a
# binary nor a test reaches (deadcode prints them; any output fails).
# Versions pinned so a fresh machine runs the same checks.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
DEADCODE := golang.org/x/tools/cmd/deadcode@v0.52.0
lint:
	@unformatted="$$($(GO) run cmd/gofmt -l .)" || exit 1; \
	if [ -n "$$unformatted" ]; then echo "$$unformatted"; echo "not gofmt-formatted: run gofmt -w"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	@dead="$$($(GO) run $(DEADCODE) -test ./...)" || exit 1; \
	if [ -n "$$dead" ]; then echo "$$dead"; echo "unreachable functions: remove them"; exit 1; fi

# Everything CI runs. Privileged tests need root; SOCKMESH_REQUIRE_PRIVILEGED=1
# turns their skips into failures. The proxy's packages, where its
# concurrency lives, and the agent's control plane and applier, which
# write status and apply snapshots from several goroutines, run again
# under the race detector (about two minutes).
# First the static binaries the demo, e2e and cluster tests build
# (test/cluster/node.BuildBinary's flags) are compiled once: on a cold build
# cache three test packages compiled them at once, on 2 cores, for minutes
# (the demo's build may take what -timeout leaves after its run).
test: lint
	CGO_ENABLED=0 $(GO) build -trimpath ./cmd/... ./test/e2ecluster/appclient ./test/cluster/node/pause
	$(GO) test -count=1 -timeout 60m ./...
	$(GO) test -race -count=1 -timeout 20m ./userspace-proxy/... ./agent/controlplane/ ./agent/apply/

# Build kube-apiserver, etcd and the other Kubernetes components the
# integration and cluster tests run, from the Go module proxy, into
# ${SOCKMESH_CACHE:-/var/cache/sockmesh} (only what is missing; a cold build
# takes 5-12 minutes on 2 cores). See test/cluster/build-binaries.sh.
k8s-binaries:
	test/cluster/build-binaries.sh all

# The cluster tier alone (it also runs in `make test`): a real single-node
# Kubernetes on this machine (test/cluster/node: node IP 10.250.0.1 on lo,
# containerd, kubelet, kube-proxy, a CNI bridge) with the sockmesh DaemonSet
# from daemonset/, as root. It leaves the machine as it found it; warm it
# takes about a minute, plus the Kubernetes build when the cache is cold.
e2e-cluster: k8s-binaries
	$(GO) test -count=1 -v -timeout 30m ./test/e2ecluster/

# Undo what a crashed cluster-tier run left on this machine (the next run
# does it too, before it starts).
e2e-cluster-clean:
	$(GO) run ./test/cluster/node/cmd/sockmesh-node down

# Every benchmark, as root, each against its baseline in the same run:
# datapath (direct / iptables REDIRECT / eBPF), proxy (vs nginx, apps
# captured by the eBPF datapath; needs wrk, h2load and nginx: apt-get
# install wrk nghttp2-client nginx-light, and haproxy for its -versus
# haproxy), routing (1-1,000 rules vs
# none), agent (10,000 Services). Each prints ratios; its package doc has
# the flags and the last numbers.
bench:
	$(GO) run ./test/bench/datapath
	$(GO) run ./test/bench/proxy
	$(GO) run ./test/bench/routing
	$(GO) run ./test/bench/agent

clean:
	rm -rf bin
