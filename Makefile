# Ferry: the two commands a newcomer runs are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
export GOTOOLCHAIN := local
export CGO_ENABLED := 0

.PHONY: test test-build image-binary tools demo fmt-check clippy control-plane realnode velero helm build fuzz

# Clippy lints the workspace's crates inside the test build itself: clippy-driver wraps rustc
# for them (as `cargo clippy` does), with warnings as errors. One compilation instead of a
# check pass followed by a build; dependencies are built as usual.
CLIPPY_DRIVER := $(shell rustc --print sysroot 2>/dev/null)/bin/clippy-driver
LINTED := RUSTC_WORKSPACE_WRAPPER=$(CLIPPY_DRIVER) CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__

## make test: formatting check, clippy with warnings as errors, every test, a short fuzz run.
## `make -j4 test` (what .ci/run runs) builds the Go tools, the Rust tests and the release binary
## the real-node tests put in Ferry's image (FERRY_IMAGE_BINARY) side by side. The
## test binaries then run two at a time, the longest first (scripts/run-tests.sh; FERRY_TEST_JOBS=1
## runs them one after another), while the fuzz targets build at low priority; then the
## documentation's examples (doc tests, which `--all-targets` leaves out) and the fuzz run.
test: fmt-check tools test-build image-binary
	@set -e; fuzz_log=$$(mktemp); nice -n 19 scripts/fuzz.sh --build-only >"$$fuzz_log" 2>&1 & fuzz=$$!; \
	trap 'kill $$fuzz 2>/dev/null || true; rm -f "$$fuzz_log"' EXIT; \
	status=0; FERRY_IMAGE_BINARY=$(IMAGE_BINARY) $(LINTED) CARGO=$(CARGO) scripts/run-tests.sh || status=$$?; \
	scripts/check-leaks.sh; \
	[ $$status = 0 ] || exit $$status; \
	wait $$fuzz || { cat "$$fuzz_log" >&2; echo "fuzz: building the targets failed" >&2; exit 1; }; \
	$(CARGO) test --workspace --locked --doc; \
	scripts/fuzz.sh 8

## The release binary the real-node tests put in Ferry's image, as the Dockerfile builds it
## (beside the test build: the two profiles build in their own folders).
IMAGE_BINARY := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)/release/ferry
image-binary:
	$(CARGO) build --locked --release -p ferry --bin ferry

## Compiles every test (clippy's lints included) without running them.
test-build:
	$(LINTED) $(CARGO) test --workspace --locked --all-targets --no-run

## The tools the tests run, built from the Go module proxy once and cached under ~/.cache/ferry.
tools: realnode velero helm

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

velero:
	scripts/build-velero.sh >/dev/null

helm:
	deploy/build-helm.sh >/dev/null

## Builds (once, then cached under ~/.cache/ferry/realnode) a real node's parts: kubelet,
## containerd, runc, CNI plugins, the CSI hostpath driver and sidecars, the controllers.
realnode: control-plane
	scripts/build-realnode.sh >/dev/null

## make demo: sets everything up, then runs Ferry end to end with visible progress.
demo: realnode
	DEMO_ARGS="$(DEMO_ARGS)" scripts/demo.sh
