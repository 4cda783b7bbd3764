#!/usr/bin/env bash
# The runtime on the oldest onnxruntime each flavor claims, and its wheel on the boards' Pythons (scripts/test.sh
# runs this after the suite; about three minutes).
#   1. the runtime's wheel resolves for Python 3.10 to 3.13 on manylinux aarch64 (JetPack 6 is Ubuntu 22.04 with
#      3.10, Raspberry Pi OS Bookworm has 3.11) from binary wheels only, pulling no onnxruntime of its own; with
#      [cpu] it resolves too, onnxruntime included (pip install --dry-run: nothing is installed)
#   2. the quick loader / runner / lossless tests on onnxruntime 1.23.2 (the last cp310 release: the cpu flavor's
#      floor; a 1.23 like NVIDIA's JetPack 6 wheel 1.23.0, the cuda flavor's floor, so cuda graphs load without
#      position_ids) and 1.24.1 (PyPI's build of the 1.24.0 sources, NVIDIA's other JetPack 6 wheel), CPU
#      provider: each is pip-installed (--target) beside the test venv and put first on PYTHONPATH, so the same
#      venv runs the tests with that onnxruntime and nothing else changed
# Needs the test venv (scripts/setup-env.sh) and the network to the package registry.
#   ./scripts/ci-ort.sh                 ORT_VERSIONS="1.23.2 1.24.1"  CI_ORT_DIR=.venv/ci-ort
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python}
ORT_VERSIONS=${ORT_VERSIONS:-"1.23.2 1.24.1"}
DIR=${CI_ORT_DIR:-$ROOT/.venv/ci-ort}
say() { echo "[ci-ort] $*" >&2; }
die() { echo "[ci-ort] FAILED: $*" >&2; exit 1; }
mkdir -p "$DIR"

# --- 1. the wheel, resolved for the boards ---------------------------------------------------------------------
say "building the runtime's wheel"
SRC=$(mktemp -d) && trap 'rm -rf "$SRC"' EXIT
tar -C "$ROOT" --exclude=./.venv --exclude=./.git --exclude=./build --exclude=./dist --exclude='*.egg-info' \
  --exclude=__pycache__ --exclude=.pytest_cache --exclude=./export -cf - . | tar -C "$SRC" -xf -
rm -f "$DIR"/edgespec-*.whl
"$PY" -m pip wheel -q --no-deps -w "$DIR" "$SRC" >/dev/null
WHEEL=$(ls "$DIR"/edgespec-*.whl)
# JetPack 6 (glibc 2.35) and Bookworm (2.36) take manylinux_2_28 and older: pip matches a --platform exactly
PLATFORMS=(--platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64)
resolve() {  # python version, requirement -> the names pip would install, one a line
  "$PY" -m pip install -q --dry-run --ignore-installed --only-binary :all: --python-version "$1" "${PLATFORMS[@]}" \
    --report "$DIR/report.json" "$2" >/dev/null 2>"$DIR/resolve.log" || { cat "$DIR/resolve.log" >&2; return 1; }
  "$PY" -c 'import json, sys; [print(i["metadata"]["name"].lower()) for i in json.load(open(sys.argv[1]))["install"]]' \
    "$DIR/report.json"
}
for pyv in 3.10 3.11 3.12 3.13; do
  names=$(resolve "$pyv" "${WHEEL}[server]") || die "edgespec[server] does not resolve for cp${pyv/./} aarch64"
  if grep -qx 'onnxruntime' <<<"$names"; then die "edgespec[server] pulls the CPU onnxruntime for cp${pyv/./}"; fi
  names=$(resolve "$pyv" "${WHEEL}[server,cpu]") || die "edgespec[server,cpu] does not resolve for cp${pyv/./} aarch64"
  grep -qx 'onnxruntime' <<<"$names" || die "edgespec[cpu] resolved without onnxruntime for cp${pyv/./}"
  say "cp${pyv/./} aarch64: edgespec[server] resolves without onnxruntime; [server,cpu] with it"
done

# --- 2. the quick tests on each old onnxruntime ----------------------------------------------------------------
BUNDLES=$DIR/bundles  # the tiny test bundles, exported once with the venv's own onnxruntime
say "tiny bundles in $BUNDLES"
"$PY" - "$BUNDLES" <<'PYEOF'
import sys
from pathlib import Path
sys.path.insert(0, "tests")
import tiny_bundles
for name in ("qwen-agree", "qwen-disagree", "llama-agree", "qwen-cuda-agree", "qwen-cuda-disagree"):
    tiny_bundles.build(name, Path(sys.argv[1]))
PYEOF
# the heads/feature bundles train at export (minutes): their lossless tests stay in the main run
QUICK=(tests/install/test_ort_floors.py tests/models/test_ortcompat.py tests/core/test_batch_runner.py
       tests/core/test_runner.py tests/engine/test_batch_per_row.py tests/test_lossless.py)
for v in $ORT_VERSIONS; do
  target=$DIR/onnxruntime-$v
  if [ ! -f "$target/.done" ]; then
    say "onnxruntime $v from the registry into $target"
    rm -rf "$target"
    "$PY" -m pip install -q --no-deps --only-binary :all: --target "$target" "onnxruntime==$v" >/dev/null
    touch "$target/.done"
  fi
  say "quick tests on onnxruntime $v (CPU provider)"
  PYTHONPATH="$target:$ROOT${PYTHONPATH:+:$PYTHONPATH}" EDGESPEC_EXPECT_ORT=$v EDGESPEC_TEST_BUNDLES=$BUNDLES \
    "$PY" -m pytest -q -p no:cacheprovider -m "not slow" -k "not heads" "${QUICK[@]}" || die "quick tests on onnxruntime $v"
done
say "ok"
