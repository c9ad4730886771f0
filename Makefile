# Ferry: the two commands a newcomer runs are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
export GOTOOLCHAIN := local
export CGO_ENABLED := 0

.PHONY: test demo fmt-check clippy control-plane realnode build fuzz

## make test: formatting check, clippy with warnings as errors, every test, a short fuzz run.
test: fmt-check clippy control-plane realnode
	$(CARGO) test --workspace --locked --all-targets --no-fail-fast
	scripts/check-leaks.sh
	scripts/fuzz.sh 8

## Longer fuzzing: make fuzz FUZZ_SECONDS=600
FUZZ_SECONDS ?= 120
fuzz:
	scripts/fuzz.sh $(FUZZ_SECONDS)

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --locked --all-targets -- -D warnings

## Builds (once, then cached under ~/.cache/ferry) kube-apiserver and etcd for the tests.
control-plane:
	scripts/build-control-plane.sh >/dev/null

build:
	$(CARGO) build --workspace --locked --release

## Builds (once, then cached under ~/.cache/ferry/realnode) a real node's parts: kubelet,
## containerd, runc, CNI plugins, the CSI hostpath driver and sidecars, the controllers.
realnode: control-plane
	scripts/build-realnode.sh >/dev/null

## make demo: sets everything up, then runs Ferry end to end with visible progress.
demo: realnode
	DEMO_ARGS="$(DEMO_ARGS)" scripts/demo.sh
