#!/usr/bin/env bash
# Checks the Prometheus files next to this script with promtool: the demo's config (and the
# rule files it loads), the rules alone, and the rules' unit tests. Runs from any working
# directory; exits non-zero on the first failure.
set -euo pipefail

# promtool resolves rule_files against the config's or the test file's own directory, but the
# file arguments themselves against the working directory: run from here.
cd "$(dirname "${BASH_SOURCE[0]}")"

promtool check config prometheus.yml
promtool check rules rules.yml
promtool test rules rules_test.yml
