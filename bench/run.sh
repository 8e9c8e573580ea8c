#!/usr/bin/env bash
# The benchmark: every scenario against a direct upstream, nginx, and
# agent-proxy side by side; results in bench/results/ (README.md, chart.svg).
# Needs nginx (apt-get install nginx-light). About 12 minutes (and the release build).
#   bash bench/run.sh            # the full run
#   bash bench/run.sh --smoke    # seconds: checks it still works
#   bash bench/run.sh --only plain,memory
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace -q
exec "${CARGO_TARGET_DIR:-target}/release/agent-proxy-bench" run "$@"
