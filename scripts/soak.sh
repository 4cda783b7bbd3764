#!/usr/bin/env bash
# A long soak of `edgespec serve` on a tiny bundle: prints the RSS / suffix index / caches curve read from
# /metrics and fails when RSS is still growing after they all reached capacity (edgespec/bench/soak.py).
#   ./scripts/soak.sh [DURATION] [soak options...]     DURATION: 90s, 10m (default), 2h, 1h30m
# EDGESPEC_SOAK_BUNDLE=DIR soaks that bundle instead of building the tiny one (which needs the export extra).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
BUNDLE=${EDGESPEC_SOAK_BUNDLE:-}
if [ -z "$BUNDLE" ]; then
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/edgespec-soak.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  echo "[soak] building the tiny bundle in $WORK" >&2
  "$PY" tests/tiny_bundles.py "$WORK" qwen-agree >/dev/null
  BUNDLE=$WORK/qwen-agree
fi
exec "$PY" -m edgespec.bench.soak "$@" --bundle "$BUNDLE"
