# Fleet — top-level entry points. See README.md.
#   make demo   install missing Debian packages, build, start the lab, reroute a job beta -> alpha
#   make test   the whole suite against a fresh lab (torn down afterwards)
#   make bench  the sbatch submission benchmark (needs the lab's packages; brings the lab up)
#   make compat the plugins against Debian trixie's Slurm 24.11 in a chroot (root; not part of make test)
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
LAB := tests/lab/lab.sh

export FLEET_LAB_DIR ?= /tmp/fleet-lab
# Where `cargo build --release` puts the binaries and plugins the lab installs.
export FLEET_BIN_DIR ?= $(abspath $(or $(CARGO_TARGET_DIR),target))/release

.PHONY: all deps build lab-up lab-down lab-status demo test bench fuzz compat chaos bench-start

all: build

deps:
	$(LAB) deps

build: deps
	$(CARGO) build --release --workspace

lab-up: build
	$(LAB) up

lab-down:
	$(LAB) down

lab-status:
	$(LAB) status

demo: build
	tests/lab/demo.sh

test: build
	tests/lab/run-tests.sh

bench: build
	tests/bench/submit_bench.sh

# Start latency: sbatch -> script running at alpha, native vs forwarded from beta.
bench-start: build
	tests/bench/start_latency.py

# kill -9 of every daemon under 100 forwarded jobs from two users; prints
# counts (not part of make test). CHAOS_JOBS, CHAOS_FAULTS, CHAOS_SEED.
chaos: build
	tests/chaos/chaos.py

# Builds into target-compat/ itself; see tests/compat/README.md.
compat:
	tests/compat/slurm-24.11.sh

# Short fuzzing run of every cargo-fuzz target (needs nightly + cargo-fuzz).
FUZZ_SECONDS ?= 30
fuzz:
	@command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz not installed: cargo install cargo-fuzz (needs nightly)"; exit 1; }
	cd slurm-plugin/slurm-conf/fuzz && for t in $$(cargo +nightly fuzz list); do \
	  cargo +nightly fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; done
