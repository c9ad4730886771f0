# Ferry: the two commands a newcomer runs are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
export GOTOOLCHAIN := local
export CGO_ENABLED := 0

.PHONY: test demo lint fmt-check clippy unit control-plane build clean-cache

## make test: formatting check, clippy with warnings as errors, and every test.
test: fmt-check clippy control-plane
	$(CARGO) test --workspace --locked --all-targets
	scripts/check-leaks.sh

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --locked --all-targets -- -D warnings

## Builds (once, then cached under ~/.cache/ferry) kube-apiserver and etcd for the tests.
control-plane:
	scripts/build-control-plane.sh >/dev/null

build:
	$(CARGO) build --workspace --locked --release

## make demo: sets everything up, then runs Ferry end to end with visible progress.
demo: control-plane
	scripts/demo.sh
