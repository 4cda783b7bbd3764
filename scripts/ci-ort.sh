#!/usr/bin/env bash
# The runtime on the oldest onnxruntime each flavor claims, and its wheel on the boards' Pythons (scripts/test.sh
# runs this after the suite; about three minutes).
#   1. the runtime's wheel and the export half's resolve for each board's Python and glibc (JetPack 6: 3.10, glibc
#      2.35; Bookworm: 3.11, 2.36; JetPack 7.2 on Orin, Ubuntu 24.04: 3.12, 2.39; Trixie: 3.13, 2.41; the rows come
#      from devices/_releases.json through scripts/board_resolve.py --boards) from binary wheels only,
#      pulling no onnxruntime of their own, and the resolved versions are printed; with [cpu] it resolves too,
#      onnxruntime included (pip install --dry-run: nothing is installed)
#   1b. the runtime's wheel pip-installed into a fresh venv (no onnxruntime), and `edgespec doctor` there: a report
#      with the install line, exit 0 or 1, no traceback
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

# --- 1. the wheels, resolved for the boards ---------------------------------------------------------------------
# each board's own Python and glibc: every manylinux tag down to 2_17 (scripts/board_resolve.py; pip matches a
# --platform exactly, so glibc <= 2.28 tags alone would check older releases than the boards get)
rm -rf "$DIR/wheels"
say "building the runtime's and the export half's wheels"
"$PY" - "$ROOT" "$DIR/wheels" <<'PYEOF'
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/scripts")
import board_resolve
board_resolve.build_wheels(Path(sys.argv[1]), Path(sys.argv[2]))
PYEOF
WHEEL=$(ls "$DIR"/wheels/edgespec-[0-9]*.whl)
EXPORT_WHEEL=$(ls "$DIR"/wheels/edgespec_export-*.whl)
resolve() {  # python version, glibc minor, requirement... -> name==version pip would install, one a line
  "$PY" "$ROOT/scripts/board_resolve.py" "$@"
}
# the rows: every supported release of devices/_releases.json, one per Python (JetPack 6: 3.10/2.35; Bookworm:
# 3.11/2.36; JetPack 7.0 to 7.2, Ubuntu 24.04: 3.12/2.39; Trixie: 3.13/2.41)
mapfile -t BOARD_ROWS < <("$PY" "$ROOT/scripts/board_resolve.py" --boards)
[ "${#BOARD_ROWS[@]}" -ge 4 ] || die "scripts/board_resolve.py --boards listed ${#BOARD_ROWS[@]} board systems"
for board in "${BOARD_ROWS[@]}"; do
  read -r pyv glibc name <<<"$board"
  at="cp${pyv/./} aarch64 glibc 2.$glibc ($name)"
  names=$(resolve "$pyv" "$glibc" "${WHEEL}[server]" "$EXPORT_WHEEL") || die "edgespec[server] + ./export does not resolve for $at"
  if grep -q '^onnxruntime' <<<"$names"; then die "edgespec[server] + ./export pulls an onnxruntime for $at"; fi
  say "$at: edgespec[server] + ./export, no onnxruntime: $(paste -sd' ' <<<"$names")"
  names=$(resolve "$pyv" "$glibc" "$EXPORT_WHEEL") || die "./export alone does not resolve for $at"
  if grep -q '^edgespec==' <<<"$names"; then die "./export alone pulls a PyPI edgespec for $at"; fi
  names=$(resolve "$pyv" "$glibc" "${WHEEL}[server,cpu]") || die "edgespec[server,cpu] does not resolve for $at"
  grep -q '^onnxruntime==' <<<"$names" || die "edgespec[cpu] resolved without onnxruntime for $at"
  say "$at: [server,cpu] takes $(grep '^onnxruntime==' <<<"$names")"
done

# --- 1b. the runtime alone, installed as a user would, and `edgespec doctor` on it -------------------------------
# (no onnxruntime: doctor still reports, names the install line, exits 0 or 1, and prints no traceback)
say "pip install of the runtime's wheel into a fresh venv, then edgespec doctor"
BASE_PY=$("$PY" -c 'import sys; print(sys.base_prefix)')/bin/python3
rm -rf "$DIR/doctor-venv"
"$BASE_PY" -m venv "$DIR/doctor-venv"
"$DIR/doctor-venv/bin/python" -m pip install -q "$WHEEL" >/dev/null 2>"$DIR/doctor-pip.log" \
  || { cat "$DIR/doctor-pip.log" >&2; die "pip install of the runtime's wheel failed"; }
set +e
(cd "$DIR" && "$DIR/doctor-venv/bin/edgespec" doctor --no-probe) >"$DIR/doctor.out" 2>&1
rc=$?
set -e
{ [ "$rc" -le 1 ] && ! grep -q Traceback "$DIR/doctor.out" && grep -q "how: pip install 'edgespec\[cpu\]'" "$DIR/doctor.out"; } \
  || { cat "$DIR/doctor.out" >&2; die "edgespec doctor without onnxruntime: exit $rc, or a traceback, or no install line"; }
say "edgespec doctor without onnxruntime: exit $rc, the report and its install line"

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
QUICK=(tests/install/test_ort_floors.py tests/models/test_ortcompat.py tests/core/test_runner_batch.py
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
