#!/usr/bin/env bash
# The GPU check: what a Linux machine with an NVIDIA GPU (a Jetson, or a host with nvidia-smi) says
# about the cuda-flavored bundles.
#
#   scripts/gpu-check.sh [--plan] [--full] [-o REPORT_DIR] [--ort-wheel FILE] [--no-install]
#                        [--smollm2 BUNDLE] [--qwen BUNDLE] [--root DIR]
#   scripts/gpu-check.sh --shape-check [--small] [-o REPORT_DIR] [--smollm2 BUNDLE] [...]
#
# --plan       print every command it would run, run nothing, write nothing (any machine: no GPU needed)
# --full       also the Qwen2.5-Coder pair (exported here unless --qwen) and the chat prompts;
#              the default (quick) is SmolLM2 only, 3 code prompts: sized for a few minutes of GPU
# --ort-wheel  install this onnxruntime-gpu wheel (a JetPack wheel from NVIDIA) instead of one from an index
# --no-install use the active python's onnxruntime as it is (it must have the CUDA provider already)
# --root DIR   read /proc/device-tree and /etc/nv_tegra_release under DIR (tests use fake trees)
# --shape-check  the 1.5B target's and 0.5B draft's exact shapes instead: GGUFs of random weights generated here
#              (no weights travel), exported natively (--ep cuda), their 1..16-token step costs at batch 1..4 with
#              and without I/O binding and CUDA graphs, the verify slope, and each drafting mode projected from
#              scripts/gpu-check-qwen-coder-cpu.json (the real pair's bench on the CPU); then the SmolLM2
#              bundle's modes end to end where its GGUF is here (or --smollm2 BUNDLE). A few minutes of GPU.
# --small      with --shape-check: a small stand-in shape on the CPU provider, no GPU, no install (a test runs it)
#
# 1. Never touches the active environment: onnxruntime-gpu goes into a venv of its own (REPORT_DIR/venv)
#    that sees the active one's packages; on an x86_64 host it is the PyPI wheel of the same version (else the newest
#    at or above the cuda flavor's onnxruntime floor, kernels.ORT_FLOORS)
#    with its [cuda,cudnn] extras (CUDA and cuDNN from pip, loaded by onnxruntime.preload_dlls() at every
#    start of that venv); on a Jetson it is NVIDIA's JetPack wheel (JetPack 6: their index; else
#    --ort-wheel) with JetPack's own CUDA; JetPack 5 (Python 3.8) is not supported. If the install fails the
#    check stops, naming what to do.
# 2. versions, doctor, tests/bench/test_gpu.py (a run where every test skipped is a failure), the SmolLM2
#    export (int8, --ep cuda; needs the export extra), verify, node placement, bench, plan --measure.
# 3. Writes REPORT_DIR (default gpu-check-<date>/): summary.md with each step's exit status and log.
#    A failing step does not stop the others. Without an NVIDIA GPU it stops at once (exit 2), unless --plan.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPORT="gpu-check-$(date -u +%Y%m%dT%H%M%SZ)"
SMOL="" QWEN="" WHEEL="" FALLBACK="" HWROOT=/ PLAN=0 FULL=0 INSTALL=1 SHAPE=0 SMALL=0
PY=${PYTHON:-python}
JETPACK6_INDEX=https://pypi.jetson-ai-lab.io/jp6/cu126

usage() { sed -n '2,33p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    -o) REPORT=$2; shift 2 ;;
    --smollm2) SMOL=$2; shift 2 ;;
    --qwen) QWEN=$2; FULL=1; shift 2 ;;
    --ort-wheel) WHEEL=$2; shift 2 ;;
    --root) HWROOT=$2; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --plan) PLAN=1; shift ;;
    --full) FULL=1; shift ;;
    --shape-check) SHAPE=1; shift ;;
    --small) SMALL=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done
die() { echo "gpu-check: $*" >&2; exit "${EXIT:-2}"; }
# abspath P: P from the caller's folder (the steps run in the checkout), without creating anything
abspath() { case "$1" in ""|/*) echo "$1" ;; *) echo "$(cd "$(dirname "$1")" 2>/dev/null && pwd || echo "$PWD/$(dirname "$1")")/$(basename "$1")" ;; esac; }
REPORT=$(abspath "$REPORT") SMOL=$(abspath "$SMOL") QWEN=$(abspath "$QWEN") WHEEL=$(abspath "$WHEEL")

[ "$SMALL" -eq 0 ] || [ "$SHAPE" -eq 1 ] || die "--small goes with --shape-check"
PROVIDER=cuda
if [ "$SMALL" -eq 1 ]; then PROVIDER=cpu INSTALL=0; fi  # the CPU provider, the active python as it is

# --- which GPU: a Jetson by its device tree or L4T release (JetPack 5 has no nvidia-smi), else nvidia-smi
[ "$(uname -s)" = "Linux" ] || die "this check runs on Linux only (found $(uname -s))"
MODEL=$({ tr -d '\0' < "$HWROOT/proc/device-tree/model"; } 2>/dev/null || true)
L4T=$(sed -n 's/^# R\([0-9]*\) (release), REVISION: \([0-9.]*\).*/\1.\2/p' "$HWROOT/etc/nv_tegra_release" 2>/dev/null || true)
JETSON=0
if [ -n "$L4T" ] || [[ "$MODEL" == *Jetson* ]]; then
  JETSON=1
  GPUS="$MODEL (integrated GPU, memory shared with the CPU; L4T ${L4T:-unknown})"
elif [ "$SMALL" -eq 1 ]; then
  GPUS="none used: --small runs on the CPU provider"
elif command -v nvidia-smi >/dev/null 2>&1; then
  GPUS=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true)
  [ -n "$GPUS" ] || [ "$PLAN" -eq 1 ] || die "no NVIDIA GPU here: nvidia-smi lists none"
  [ -n "$GPUS" ] || GPUS="none: nvidia-smi lists none (--plan: what an x86_64 GPU host would run)"
elif [ "$PLAN" -eq 1 ]; then
  GPUS="none found (--plan: what an x86_64 GPU host would run)"
else
  die "no NVIDIA GPU here: nvidia-smi is not installed, and $HWROOT is no Jetson (no /proc/device-tree/model naming one, no /etc/nv_tegra_release)"
fi
[ -z "$WHEEL" ] || [ -f "$WHEEL" ] || die "--ort-wheel $WHEEL: no such file"
# the steps import this checkout's edgespec: on the path before anything asks for it
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# edgespec and its requirements, without importing it: importing needs an onnxruntime, which step 1 may install
"$PY" -c 'import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in ("edgespec", "numpy", "tokenizers")) else 1)' \
  2>/dev/null || die "edgespec or its requirements (numpy, tokenizers) are not importable with $PY: activate the project's venv first (source scripts/setup-env.sh)"

# --- which onnxruntime-gpu, from where
ORT_VERSION=$("$PY" -c 'import onnxruntime; print(onnxruntime.__version__)' 2>/dev/null || true)
# the oldest that takes the cuda flavor, read from the file (no onnxruntime needed to read it)
FLOOR=$("$PY" -c 'import runpy, sys; print(runpy.run_path(sys.argv[1])["ORT_FLOORS"]["cuda"])' "$ROOT/edgespec/models/kernels.py")
if [ -n "$WHEEL" ]; then
  SPEC=("$WHEEL")
elif [ "$JETSON" -eq 1 ]; then
  [ "${L4T%%.*}" = 36 ] || [ "$INSTALL" -eq 0 ] || \
    die "a Jetson with L4T ${L4T:-unknown} (not JetPack 6): edgespec runs on JetPack 6 (Python 3.10, NVIDIA's onnxruntime-gpu >= $FLOOR from $JETPACK6_INDEX); JetPack 5 (Python 3.8) is not supported (docs/jetson.md). An onnxruntime-gpu >= $FLOOR you built for this board: pass it with --ort-wheel FILE"
  SPEC=("onnxruntime-gpu>=$FLOOR" --index-url "$JETPACK6_INDEX")  # NVIDIA's JetPack 6 index; CUDA comes with JetPack
else
  # the CUDA/cuDNN runtime from pip; the same version as onnxruntime, else (not published) the newest >= the floor
  SPEC=("onnxruntime-gpu[cuda,cudnn]${ORT_VERSION:+==$ORT_VERSION}")
  [ -z "$ORT_VERSION" ] || FALLBACK="onnxruntime-gpu[cuda,cudnn]>=$FLOOR"
  [ -n "$ORT_VERSION" ] || SPEC=("onnxruntime-gpu[cuda,cudnn]>=$FLOOR")
fi
HINT=""
if [ "$JETSON" -eq 1 ] || [ "$(uname -m)" = aarch64 ]; then
  HINT=" On aarch64 PyPI has no CUDA build: take NVIDIA's JetPack 6 wheel (onnxruntime-gpu >= $FLOOR from $JETPACK6_INDEX; docs/jetson.md) and pass it with --ort-wheel FILE."
fi

[ "$PLAN" -eq 1 ] || mkdir -p "$REPORT/logs" "$REPORT/bundles"
SUMMARY="$REPORT/summary.md"
FAILED=0
START=$(date +%s)
# show ARGS...: a command as one line a shell would read back (arguments with spaces or quotes in '...')
show() {
  local a out=""
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then out+="$a "; else out+="'${a//\'/\'\\\'\'}' "; fi
  done
  echo "${out% }"
}

# step NAME TIMEOUT_S COMMAND...: runs it with a time limit, logs it, records the exit status
step() {
  local name=$1 limit=$2; shift 2
  if [ "$PLAN" -eq 1 ]; then echo "[$name, ${limit}s] $(show "$@")"; return 0; fi
  local log="$REPORT/logs/$name.log" t0 rc
  t0=$(date +%s)
  echo "== $name: $*" | tee "$log"
  set +e
  (cd "$ROOT" && timeout "$limit" "$@") >>"$log" 2>&1
  rc=$?
  set -e
  [ "$rc" -eq 0 ] || FAILED=$((FAILED + 1))
  echo "| $name | $rc | $(( $(date +%s) - t0 )) | logs/$name.log |" >> "$SUMMARY"
  echo "   exit $rc ($(( $(date +%s) - t0 )) s)"
}

# --- 1. onnxruntime-gpu in its own venv (the active environment is never changed)
if [ "$INSTALL" -eq 1 ]; then
  VENV="$REPORT/venv"
  # pip >= 22.3 installs into another interpreter (--python); an older one (Ubuntu 22.04's, JetPack 6)
  # cannot, so the venv then gets a pip of its own. Either way pip runs as the venv's, and so never
  # removes a package of the active environment (outside its environment).
  if "$PY" -m pip --help 2>/dev/null | grep -q -- '--python <python>'; then
    VENV_ARGS=(--without-pip) PIP=("$PY" -m pip --python "$VENV/bin/python")
  else
    VENV_ARGS=() PIP=("$VENV/bin/python" -m pip)
  fi
  if [ "$PLAN" -eq 1 ]; then
    echo "# onnxruntime-gpu into $VENV (it sees this python's packages; this python is not changed)"
    show "$PY" -m venv "${VENV_ARGS[@]}" "$VENV"
    echo "(writes $VENV/.../site-packages/_edgespec_base.pth: site.addsitedir of each of $PY's site-packages, user site too)"
    show "${PIP[@]}" install "${SPEC[@]}"
    [ -z "$FALLBACK" ] || echo "(if that version is not published: $(show "${PIP[@]}" install "$FALLBACK"))"
    [ "$JETSON" -eq 1 ] || echo "(writes _edgespec_preload.pth: onnxruntime.preload_dlls() at every start of $VENV/bin/python, through edgespec.bench.gpucheck)"
  else
    SITE=""
    { "$PY" -m venv "${VENV_ARGS[@]}" "$VENV" &&
      SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))') &&
      "$PY" -c 'import site; u = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []; print("import site; " + "; ".join("site.addsitedir(%r)" % p for p in site.getsitepackages() + u))' > "$SITE/_edgespec_base.pth" &&
      { "${PIP[@]}" install "${SPEC[@]}" ||
        { [ -n "$FALLBACK" ] && SPEC=("$FALLBACK") && "${PIP[@]}" install "$FALLBACK"; }; }
    } > "$REPORT/logs/install.log" 2>&1 || EXIT=3 die "could not install ${SPEC[*]} into $VENV (log: $REPORT/logs/install.log). $PY and its onnxruntime ${ORT_VERSION:-?} were not changed.$HINT"
    [ "$JETSON" -eq 1 ] || echo "import os; os.environ.get('EDGESPEC_NO_PRELOAD') or __import__('edgespec.bench.gpucheck', fromlist=['x']).preload()" > "$SITE/_edgespec_preload.pth"
  fi
  PY="$VENV/bin/python"
fi

if [ "$PLAN" -eq 1 ]; then
  echo "# gpu-check plan: GPU: $GPUS; report: $REPORT; python for the steps: $PY"
else
  { echo "# edgespec GPU check"; echo
    echo "- date (UTC): $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "- GPU: $GPUS"
    if [ "$INSTALL" -eq 1 ]; then echo "- onnxruntime: ${SPEC[*]} into $PY"; else echo "- onnxruntime: ${ORT_VERSION:-not importable} as found (--no-install)"; fi
    echo "- host: $(uname -srm), $(nproc) CPU cores; commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo; echo "| step | exit | seconds | log |"; echo "|---|---|---|---|"; } > "$SUMMARY"
fi

# --- 2. the steps
if [ "$SHAPE" -eq 1 ]; then
  # the default pair's shapes from random weights: GGUFs written here, exported by the native exporter
  SHAPES="$REPORT/bundles/qwen-coder-shapes"
  SMALLFLAG=""
  [ "$SMALL" -eq 0 ] || SMALLFLAG=--small
  step versions 60 "$PY" -c 'import onnxruntime as o, sys; print(sys.version); print(o.__version__, o.get_available_providers())'
  # both at once (numpy quantizes on one core each): the target's 1.5B values take the longer
  GEN="import json, sys; from edgespec_export.native.tiny_gguf import make_gguf; make_gguf(sys.argv[1], **json.loads(sys.argv[2]))"
  step ggufs 420 bash -c "for R in target draft; do $PY -c '$GEN' '$REPORT/bundles/'\$R.gguf \"\$($PY -m edgespec.bench.gpucheck shape \$R $SMALLFLAG)\" & done; wait -n && wait -n"
  # random weights: parity is not the question here (--force, a short parity text)
  step export-shapes 600 "$PY" -m edgespec export --target "$REPORT/bundles/target.gguf" \
    --draft-model "$REPORT/bundles/draft.gguf" --ep cuda --force --parity-tokens 16 -o "$SHAPES" -q
  ACCEPT="$ROOT/scripts/gpu-check-qwen-coder-cpu.json"  # the real pair's bench on the CPU: its acceptance
  step step-costs 600 bash -c "$PY -m edgespec.bench.gpucheck steps '$SHAPES' --provider $PROVIDER --json '$REPORT/steps.json' $([ ! -f "$ACCEPT" ] || echo "--bench '$ACCEPT'") $([ "$SMALL" -eq 0 ] || echo '--repeats 2 --past 32')"
  # the real SmolLM2 bundle's drafting modes end to end, where its GGUF (or a bundle) is here: nothing is fetched
  SMOL_GGUF=$("$PY" -c "from edgespec.models.store import find_model as f; print(f('smollm2-135m-instruct') or '')" 2>/dev/null || true)
  if [ -z "$SMOL" ] && [ -n "$SMOL_GGUF" ] && [ "$SMALL" -eq 0 ]; then
    SMOL="$REPORT/bundles/smollm2-cuda"
    step export-smollm2 600 "$PY" -m edgespec export --target "$SMOL_GGUF" --ep cuda -o "$SMOL" -q
  fi
  if [ -n "$SMOL" ]; then
    step bench-smollm2 600 "$PY" -m edgespec bench "$SMOL" --prompts code --limit 3 --max-new-tokens 64 --repeats 1 \
      --json "$REPORT/bench-smollm2-code.json" --project none
  elif [ "$PLAN" -eq 0 ]; then
    echo "| smollm2 | skipped: no smollm2-135m-instruct GGUF here (edgespec pull, or --smollm2 BUNDLE) | 0 | - |" >> "$SUMMARY"
  fi
  if [ "$PLAN" -eq 1 ]; then echo "# nothing was run (--plan)"; exit 0; fi
  { echo; echo "Total: $(( $(date +%s) - START )) s, $FAILED step(s) failed."
    [ ! -f "$REPORT/steps.json" ] || "$PY" -c 'import json, sys
from edgespec.bench import shapecheck
s = json.load(open(sys.argv[1]))
print("\n".join(shapecheck.render(s, s.get("projection"), label=sys.argv[2])))' "$REPORT/steps.json" \
      "$([ "$SMALL" -eq 0 ] || echo ' (SMALL stand-in shape on the CPU provider: not the real sizes)')"
    "$PY" -m edgespec.bench.gpucheck summary "$REPORT" || true
  } >> "$SUMMARY"
  echo "report: $SUMMARY"
  [ "$FAILED" -eq 0 ]
  exit
fi
step versions 60 "$PY" -c 'import onnxruntime as o, sys; print(sys.version); print(o.__version__, o.get_available_providers())'
step doctor 120 "$PY" -m edgespec doctor --json
step test-gpu 600 bash -c "$PY -m pytest -q -rs tests/bench/test_gpu.py --junitxml '$REPORT/test_gpu.xml'; rc=\$?; $PY -m edgespec.bench.gpucheck junit '$REPORT/test_gpu.xml' && exit \$rc"

GGUF_OF="from edgespec.models.store import find_model as f; import sys; print(f(sys.argv[1]) or '')"
if [ -z "$SMOL" ]; then
  SMOL="$REPORT/bundles/smollm2-int8-cuda"
  step export-smollm2 900 bash -c "$PY -m edgespec pull smollm2-135m-instruct && $PY -m edgespec export --target \"\$($PY -c \"$GGUF_OF\" smollm2-135m-instruct)\" --quant int8 --ep cuda -o '$SMOL' -q"
fi
BUNDLES=("$SMOL")
if [ "$FULL" -eq 1 ]; then
  if [ -z "$QWEN" ]; then
    QWEN="$REPORT/bundles/qwen-coder-cuda"
    step export-qwen 2400 bash -c "$PY -m edgespec pull qwen2.5-coder-1.5b-instruct && $PY -m edgespec pull qwen2.5-coder-0.5b-instruct && $PY -m edgespec export --target \"\$($PY -c \"$GGUF_OF\" qwen2.5-coder-1.5b-instruct)\" --draft-model \"\$($PY -c \"$GGUF_OF\" qwen2.5-coder-0.5b-instruct)\" --ep cuda -o '$QWEN' -q"
  fi
  BUNDLES+=("$QWEN")
fi

PROMPTS=(code) LIMIT=3
[ "$FULL" -eq 0 ] || { PROMPTS=(code chat); LIMIT=6; }
for B in "${BUNDLES[@]}"; do
  N=$(basename "$B")
  step "verify-$N" 300 "$PY" -m edgespec verify --load "$B"
  step "placement-$N" 300 bash -c "$PY -m edgespec.bench.placement '$B' --providers cuda,cpu > '$REPORT/placement-$N.json'"
  for P in "${PROMPTS[@]}"; do
    step "bench-$N-$P" 900 "$PY" -m edgespec bench "$B" --prompts "$P" --limit "$LIMIT" --repeats 1 \
      --json "$REPORT/bench-$N-$P.json" --project none
  done
  step "plan-measure-$N" 600 bash -c "$PY -m edgespec plan '$B' --measure --json > '$REPORT/plan-$N.json'"
done

if [ "$PLAN" -eq 1 ]; then echo "# nothing was run (--plan)"; exit 0; fi
{ echo
  echo "Total: $(( $(date +%s) - START )) s, $FAILED step(s) failed."
  echo "Placement: placement-*.json (op type -> provider -> nodes; Memcpy nodes; key ops off CUDA)."
  echo "Speed: bench-*.json; memory: plan-*.json (host RSS, device memory and the CUDA context's own cost)."
  "$PY" -m edgespec.bench.gpucheck summary "$REPORT" || echo "(no findings: the summary could not be read)"
} >> "$SUMMARY"
echo "report: $SUMMARY"
[ "$FAILED" -eq 0 ]
