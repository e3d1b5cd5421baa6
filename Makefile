# Fleet — top-level entry points. See README.md.
#   make demo   install missing Debian packages, build, start the lab, reroute a job beta -> alpha
#   make test   the whole suite against a fresh lab (torn down afterwards)
#   make bench  the sbatch submission benchmark (needs the lab's packages; brings the lab up)
#   make compat the plugins against Debian trixie's Slurm 24.11 in a chroot (root; not part of make test)
#   make install         plugins (Slurm's names), programs, systemd units, configs (PREFIX, DESTDIR)
#   make install-users   the service users and tokens (root; as the Debian packages' postinst)
#   make deb             Debian packages (cargo-deb) in $(DEB_DIR)
#   make install-check   install into a scratch DESTDIR and build the .debs, checking both
#   make deb-lab         the .debs unpacked into a fresh root run a federated job in a lab of their own (not in make test)
#   make chaos-failover  checkpointing jobs through cluster deaths and partitions; prints the failover figures
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
LAB := tests/lab/lab.sh

export FLEET_LAB_DIR ?= /tmp/fleet-lab
# Where `cargo build --release` puts the binaries and plugins the lab installs.
export FLEET_BIN_DIR ?= $(abspath $(or $(CARGO_TARGET_DIR),target))/release

.PHONY: all deps build lab-up lab-down lab-status demo test bench fuzz compat \
	install install-users deb install-check deb-lab chaos chaos-failover bench-start

# ---- install -----------------------------------------------------------
# Slurm's own plugin directory: where Debian's slurm-wlm-basic-plugins put
# theirs (/usr/lib/<multiarch>/slurm-wlm), so that the default PluginDir
# finds job_submit_fleet.so and spank_fleet.so without a slurm.conf change.
PREFIX ?= /usr/local
DESTDIR ?=
SYSCONFDIR ?= /etc
SLURM_PLUGIN_DIR ?= $(or $(shell dpkg -L slurm-wlm-basic-plugins 2>/dev/null | grep -m1 '/job_submit_[a-z_]*\.so$$' | xargs -r dirname),\
	/usr/lib/$(shell dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)/slurm-wlm)
DEB_DIR ?= $(abspath $(or $(CARGO_TARGET_DIR),target))/debian
export PREFIX DESTDIR SYSCONFDIR SLURM_PLUGIN_DIR

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
	tests/install/install-check.sh --fast
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

# Failover under faults (docs/failover.md): >= 100 checkpointing jobs over
# alpha, delta and kube-gamma while clusters, agents, slurmctld and the
# meta-scheduler die and an agent is cut off beyond its lease; prints jobs
# completed exactly once, lost jobs, most copies of one job at once, lost
# work per move, detection and restart times (not part of make test).
# CHAOS_FAILOVER_JOBS, CHAOS_FAILOVER_STEPS, CHAOS_FAILOVER_CKPT.
chaos-failover: build
	FLEET_LAB_KUBE=1 tests/chaos/failover.py

# Builds into target-compat/ itself; see tests/compat/README.md.
compat:
	tests/compat/slurm-24.11.sh; a=$$?; tests/compat/fleet-24.11.sh; b=$$?; exit $$((a || b))

# Short fuzzing run of every target of every cargo-fuzz crate (a fuzz/
# directory with a Cargo.toml: slurm-plugin/slurm-conf/fuzz, fuzz/), each
# FUZZ_SECONDS, niced; needs nightly + cargo-fuzz. Corpora grow in
# <dir>/corpus/<target> (not in git), seeded from <dir>/seeds/<target>;
# a crash stops the run and leaves its input in <dir>/artifacts/<target>.
# FUZZ_SANITIZER=address for ASan (the targets are safe Rust: none is ~2x
# faster).
FUZZ_SECONDS ?= 30
FUZZ_SANITIZER ?= none
FUZZ_DIRS ?= $(patsubst %/Cargo.toml,%,$(shell find . -path ./target -prune -o -path '*/target*' -prune -o -path '*/fuzz/Cargo.toml' -print | sed 's|^\./||' | sort))
fuzz:
	@command -v cargo-fuzz >/dev/null || { echo "cargo-fuzz not installed: cargo install cargo-fuzz (needs nightly)"; exit 1; }
	for d in $(FUZZ_DIRS); do \
	  (cd $$d && for t in $$(cargo +nightly fuzz list); do \
	    mkdir -p corpus/$$t; \
	    seeds=; [ -d seeds/$$t ] && seeds=seeds/$$t; \
	    echo "== fuzz $$d $$t ($(FUZZ_SECONDS) s)"; \
	    nice -n 10 cargo +nightly fuzz run -s $(FUZZ_SANITIZER) $$t corpus/$$t $$seeds -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	  done) || exit 1; \
	done

# Needs `make build` first (it does not build, so that `sudo make install`
# does not compile as root).
install:
	packaging/install.sh

install-users:
	sh packaging/debian/fleet-agent/postinst configure
	sh packaging/debian/fleet-metasched/postinst configure

# fleet-slurm-plugins, fleet-agent, fleet-proxy, fleet-metasched (with fleetctl),
# fleet-ckpt (the checkpoint helper jobs and agents call).
# DEB_PROFILE=dev packages debug builds (for a quick check; cargo-deb warns).
DEB_CRATES := job-submit-fleet fleet-agent fleet-proxy fleet-metasched fleet-ckpt
DEB_PROFILE ?= release
# Extra cargo-deb flags (tests/install/deb-lab.sh: --fast, quicker compression).
DEB_FLAGS ?=
deb:
	@command -v cargo-deb >/dev/null || { echo "cargo-deb not installed: cargo install cargo-deb"; exit 1; }
	$(CARGO) build --profile $(DEB_PROFILE) -p job-submit-fleet -p spank-fleet -p fleet-agent -p fleet-proxy -p fleet-metasched -p fleetctl -p fleet-ckpt
	mkdir -p $(DEB_DIR)
	for c in $(DEB_CRATES); do $(CARGO) deb --no-build --profile $(DEB_PROFILE) $(DEB_FLAGS) -p $$c -o $(DEB_DIR) || exit 1; done

install-check:
	tests/install/install-check.sh

# The Debian packages as a site runs them (tests/install/deb-lab.sh): built
# (DEB_PROFILE), unpacked into a fresh root, units verified, and a lab of
# their own (FLEET_DEB_LAB_DIR, FLEET_DEB_LAB_PORT_OFFSET; default
# /tmp/fleet-lab-deb, +2000) running a federated job on the packaged
# programs and plugins. Not in `make test`: release packages take minutes.
deb-lab:
	tests/install/deb-lab.sh
