#!/usr/bin/env bash
# The benchmark: every scenario against a direct upstream, nginx, and
# agent-proxy side by side; results in bench/results/ (README.md, chart.svg).
# Needs nginx (apt-get install nginx-light). About 15 minutes (and the release build).
#   bash bench/run.sh            # the full run
#   bash bench/run.sh --smoke    # seconds: checks it still works
#   bash bench/run.sh --only plain,memory
#   PGO=1 bash bench/run.sh      # the image's profile-guided build (tools/pgo-build),
#                                # the plain release build beside it as "(B)"
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --workspace -q
release="${CARGO_TARGET_DIR:-target}/release"
if [ "${PGO:-0}" = 1 ]; then
  pgo=$(bash tools/pgo-build)
  exec "$release/agent-proxy-bench" run --proxy-bin "$pgo" --baseline-bin "$release/agent-proxy" "$@"
fi
exec "$release/agent-proxy-bench" run "$@"
