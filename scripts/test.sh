#!/usr/bin/env bash
# The test suite, exactly as CI runs it: system packages (as root), the venv, the real models the slow tests
# need (fetched by edgespec's own `pull`), then pytest over everything, slow tests included, then the runtime on
# the oldest onnxruntime each graph flavor claims and its wheel resolved for the boards (scripts/ci-ort.sh).
#   ./scripts/test.sh [pytest args...]        e.g. ./scripts/test.sh -m "not slow"
# ci-ort.sh runs after a full run (no arguments), or whenever EDGESPEC_CI_ORT=1; EDGESPEC_CI_ORT=0 skips it.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
"$ROOT/scripts/system-deps.sh"
EXPORT=${EXPORT:-torch} source "$ROOT/scripts/setup-env.sh"  # the tiny test bundles are built with torch
CI_ORT=${EDGESPEC_CI_ORT:-$([ $# -eq 0 ] && echo 1 || echo 0)}
python -m pytest "$@"
if [ "$CI_ORT" = 1 ]; then
  "$ROOT/scripts/ci-ort.sh"
else
  echo "[test] not run: scripts/ci-ort.sh (older onnxruntime releases, the aarch64 wheel check); EDGESPEC_CI_ORT=1 runs it" >&2
fi
