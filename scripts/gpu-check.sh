#!/usr/bin/env bash
# The GPU check: what a Linux machine with an NVIDIA GPU says about the cuda-flavored bundles.
#
#   scripts/gpu-check.sh [-o REPORT_DIR] [--smollm2 BUNDLE] [--qwen BUNDLE] [--no-install] [--no-qwen]
#
# 1. installs onnxruntime-gpu into the active venv (the same version as its onnxruntime; --no-install
#    keeps what is there), and checks that the CUDA provider really runs (edgespec doctor);
# 2. exports the cuda flavor of SmolLM2 (int8) and of the default Qwen2.5-Coder pair (int4), unless
#    bundles are passed in (--smollm2, --qwen) or --no-qwen;
# 3. runs tests/test_gpu.py, node placement (every GroupQueryAttention and MatMulNBits node on CUDA,
#    no Memcpy inside a layer: python -m edgespec.bench.placement), `edgespec bench` (target, model, ngram,
#    auto; code and chat prompts) and `edgespec plan --measure` (host RSS and device memory);
# 4. writes everything under REPORT_DIR (default gpu-check-<date>/) with summary.md listing each
#    step, its exit status and its log. A failing step does not stop the others.
#
# Budget: about 8 minutes on a data-centre GPU with the bundles passed in or the Qwen export skipped;
# exporting the Qwen pair is CPU work (about 10 minutes on 2 cores, less on a server). It needs the
# export extra (torch, onnxruntime-genai) for exporting and for the tiny test bundles.
# Without an NVIDIA GPU it stops at once, saying so (exit 2).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPORT="gpu-check-$(date -u +%Y%m%dT%H%M%SZ)"
SMOL=""
QWEN=""
INSTALL=1
DO_QWEN=1
PY=${PYTHON:-python}

usage() { sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    -o) REPORT=$2; shift 2 ;;
    --smollm2) SMOL=$2; shift 2 ;;
    --qwen) QWEN=$2; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --no-qwen) DO_QWEN=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 64 ;;
  esac
done

die() { echo "gpu-check: $*" >&2; exit 2; }

[ "$(uname -s)" = "Linux" ] || die "this check runs on Linux only (found $(uname -s))"
command -v nvidia-smi >/dev/null 2>&1 || die "no NVIDIA GPU here: nvidia-smi is not installed (this check needs a machine with an NVIDIA GPU and its driver)"
GPUS=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true)
[ -n "$GPUS" ] || die "no NVIDIA GPU here: nvidia-smi lists none"
"$PY" -c 'import edgespec' 2>/dev/null || die "edgespec is not importable with $PY: activate the project's venv first (source scripts/setup-env.sh)"

mkdir -p "$REPORT/logs" "$REPORT/bundles"
REPORT=$(cd "$REPORT" && pwd)
SUMMARY="$REPORT/summary.md"
START=$(date +%s)
{
  echo "# edgespec GPU check"
  echo
  echo "- date (UTC): $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- GPU: $GPUS"
  echo "- host: $(uname -srm), $(nproc) CPU cores"
  echo "- commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo
  echo "| step | exit | seconds | log |"
  echo "|---|---|---|---|"
} > "$SUMMARY"
FAILED=0

# step NAME TIMEOUT_S COMMAND...: runs it with a time limit, logs it, records the exit status
step() {
  local name=$1 limit=$2; shift 2
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
  return 0
}

if [ "$INSTALL" -eq 1 ]; then
  ORT_VERSION=$("$PY" -c 'import onnxruntime; print(onnxruntime.__version__)' 2>/dev/null || echo "")
  step install-onnxruntime-gpu 900 bash -c "$PY -m pip uninstall -y onnxruntime && $PY -m pip install 'onnxruntime-gpu${ORT_VERSION:+==$ORT_VERSION}'"
fi
step versions 60 "$PY" -c 'import onnxruntime as o, sys; print(sys.version); print(o.__version__, o.get_available_providers())'
step doctor 120 "$PY" -m edgespec doctor --json
cp "$REPORT/logs/doctor.log" "$REPORT/doctor.json" 2>/dev/null || true

# bundles: passed in, or exported here (cuda flavor)
if [ -z "$SMOL" ]; then
  SMOL="$REPORT/bundles/smollm2-int8-cuda"
  step pull-smollm2 600 "$PY" -m edgespec pull smollm2-135m-instruct
  GGUF=$("$PY" -c 'from edgespec.models.store import find_model; print(find_model("smollm2-135m-instruct") or "")')
  step export-smollm2 900 "$PY" -m edgespec export --target "$GGUF" --quant int8 --ep cuda -o "$SMOL" -q
fi
BUNDLES=("$SMOL")
if [ "$DO_QWEN" -eq 1 ]; then
  if [ -z "$QWEN" ]; then
    QWEN="$REPORT/bundles/qwen-coder-cuda"
    step pull-qwen 1200 bash -c "$PY -m edgespec pull qwen2.5-coder-1.5b-instruct && $PY -m edgespec pull qwen2.5-coder-0.5b-instruct"
    TQ=$("$PY" -c 'from edgespec.models.store import find_model; print(find_model("qwen2.5-coder-1.5b-instruct") or "")')
    DQ=$("$PY" -c 'from edgespec.models.store import find_model; print(find_model("qwen2.5-coder-0.5b-instruct") or "")')
    step export-qwen 1800 "$PY" -m edgespec export --target "$TQ" --draft "$DQ" --ep cuda -o "$QWEN" -q
  fi
  BUNDLES+=("$QWEN")
fi

step test-gpu 600 "$PY" -m pytest -q -rs tests/test_gpu.py --junitxml "$REPORT/test_gpu.xml"

for B in "${BUNDLES[@]}"; do
  N=$(basename "$B")
  [ -f "$B/manifest.json" ] || { echo "| $N | missing | 0 | no bundle at $B |" >> "$SUMMARY"; FAILED=$((FAILED + 1)); continue; }
  step "verify-$N" 300 "$PY" -m edgespec verify --load "$B"
  step "placement-$N" 300 bash -c "$PY -m edgespec.bench.placement '$B' --providers cuda,cpu > '$REPORT/placement-$N.json'"
  for P in code chat; do
    # every mode the bundle supports (target, model with a draft, ngram, auto); 6 prompts, 1 repeat: the budget
    step "bench-$N-$P" 900 "$PY" -m edgespec bench "$B" --prompts "$P" --limit 6 --repeats 1 \
      --json "$REPORT/bench-$N-$P.json" --project none
  done
  step "plan-measure-$N" 600 bash -c "$PY -m edgespec plan '$B' --measure --json > '$REPORT/plan-$N.json'"
done

{
  echo
  echo "Total: $(( $(date +%s) - START )) s, $FAILED step(s) failed."
  echo "Placement: placement-*.json (op type -> provider -> nodes; Memcpy nodes; key ops off CUDA)."
  echo "Speed: bench-*.json (edgespec bench --json); memory: plan-*.json (host RSS and device_measured_bytes)."
} >> "$SUMMARY"
echo "report: $SUMMARY"
[ "$FAILED" -eq 0 ]
