#!/usr/bin/env bash
# Creates .venv (once) and installs edgespec with its extras, and the export half (export/).
# Sourced by quickstart.sh and test.sh.
#   EXTRAS=server,test  (default: all)   PYTHON=python3.11
#   EXPORT=1 (default: the export half's base install, which exports .gguf files natively, no torch)
#   EXPORT=torch (also its [torch] extra: Hugging Face sources, --via torch, the test suite's tiny bundles)
#   EXPORT=0 (the device runtime alone)
#   ORT_GPU=auto (default) | 0: on a Jetson, fetch NVIDIA's onnxruntime-gpu when the venv has no GPU onnxruntime
#   EDGESPEC_SETUP_PLAN=1: print what would be installed (one pip argument a line) and change nothing
# With EXPORT=torch, torch is installed first, and pinned: a CPU build of 2.13.0 is what the export path was tested
# with, and a plain `torch` requirement would pull a multi-GB CUDA build.
#
# A GPU board (a Jetson: /etc/nv_tegra_release, or a $PYTHON whose onnxruntime has the CUDA provider) never gets
# PyPI's CPU onnxruntime: it owns the same `onnxruntime` module as NVIDIA's onnxruntime-gpu and would replace it.
# There the `cpu` extra is left out (`all` means server,plot,test), a $PYTHON with a GPU onnxruntime gets a venv
# that sees it (--system-site-packages), and a venv without one gets the onnxruntime-gpu its JetPack release's row in
# devices/_releases.json names (NVIDIA's index for JetPack 6.1 to 6.2.2, L4T r36.4/r36.5 and later r36.x), or the
# reason there is none. Every such choice is said on stderr. A Python older than 3.10 is refused in one line first.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${EDGESPEC_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-all}
EXPORT=${EXPORT:-1}
ORT_GPU=${ORT_GPU:-auto}
TEGRA_RELEASE=${EDGESPEC_TEGRA_RELEASE:-/etc/nv_tegra_release}  # tests point this at a fake board's file
STAMP=$VENV/.edgespec-installed
setup_say() { echo "[setup] $*" >&2; }

# --- Python 3.10 or newer, before pip builds anything (JetPack 5 ships 3.8, where pip fails on setuptools>=77) ------
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; then
  py_found=$("$PYTHON" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])' 2>/dev/null || echo "not found")
  setup_say "edgespec needs Python 3.10 or newer; $PYTHON is $py_found (JetPack 5 and older ship 3.8: flash JetPack 6.2.2; or PYTHON=python3.11 names another)"
  # shellcheck disable=SC2317  # sourced: return; run as a script: exit
  return 1 2>/dev/null || exit 1
fi

# --- what kind of board this is ----------------------------------------------------------------------------------
cuda_ort() {  # $1: a python; true when its onnxruntime has the CUDA provider
  "$1" -c 'import onnxruntime as o, sys; sys.exit("CUDAExecutionProvider" not in o.get_available_providers())' \
    >/dev/null 2>&1
}
l4t=""
if [ -r "$TEGRA_RELEASE" ]; then
  l4t=$(sed -n 's/^# R\([0-9]*\) (release), REVISION: \([0-9.]*\).*/\1.\2/p' "$TEGRA_RELEASE" | head -n1)
  l4t=${l4t:-unknown}
fi
# the board's JetPack row in devices/_releases.json: where its onnxruntime-gpu comes from (read by the same module
# `edgespec doctor` uses, run as a plain script: no venv yet)
jetpack="" ort_source="" ort_index="" ort_req="" ort_what=""
if [ -n "$l4t" ]; then
  IFS=$'\t' read -r jetpack ort_source ort_index ort_req ort_what \
    <<<"$("$PYTHON" "$ROOT/edgespec/edge/releases.py" setup "$l4t" || true)"
fi
system_gpu_ort=0
if command -v "$PYTHON" >/dev/null 2>&1 && cuda_ort "$PYTHON"; then system_gpu_ort=1; fi
gpu_board=0
if [ -n "$l4t" ] || [ "$system_gpu_ort" = 1 ]; then gpu_board=1; fi

extras=$EXTRAS
venv_flags=()
if [ "$gpu_board" = 1 ]; then
  # the same extras less the CPU onnxruntime
  extras=$(tr ',' '\n' <<<"$EXTRAS" | sed 's/^all$/server,plot,test/' | tr ',' '\n' | { grep -vx 'cpu' || true; } | paste -sd, -)
  if [ "$EXPORT" = torch ]; then
    setup_say "EXPORT=torch is not for a GPU board: onnxruntime-genai (the [torch] extra) requires PyPI's CPU" \
      "onnxruntime and has no cp310 aarch64 wheel; a .gguf exports with EXPORT=1 (the default)"
    # shellcheck disable=SC2317  # sourced: return; run as a script: exit
    return 1 2>/dev/null || exit 1
  fi
  [ "$system_gpu_ort" = 1 ] && venv_flags=(--system-site-packages)
fi

want=$( (cat "$ROOT/pyproject.toml" "$ROOT/export/pyproject.toml"; echo "$EXTRAS $EXPORT $gpu_board $system_gpu_ort") \
  | sha256sum | cut -c1-16)

if [ "${EDGESPEC_SETUP_PLAN:-0}" = 1 ]; then  # what would be installed, for tests and the curious
  echo "gpu_board=$gpu_board l4t=${l4t:-none} jetpack=${jetpack:-none} onnxruntime=${ort_source:-pypi-cpu}" \
    "system_gpu_onnxruntime=$system_gpu_ort venv=${venv_flags[*]:-plain}"
  echo "-e $ROOT${extras:+[$extras]}"
  if [ "$EXPORT" = torch ]; then echo "torch==2.13.0"; echo "-e $ROOT/export[torch]"; fi
  if [ "$EXPORT" = 1 ]; then echo "-e $ROOT/export"; fi
  # shellcheck disable=SC2317  # sourced: return; run as a script: exit
  return 0 2>/dev/null || exit 0
fi

if [ "$gpu_board" = 1 ]; then
  setup_say "a GPU board (L4T ${l4t:-none}; ${PYTHON}'s onnxruntime with CUDA: $([ "$system_gpu_ort" = 1 ] && echo yes || echo no)):" \
    "installing edgespec[${extras}] without PyPI's CPU onnxruntime"
fi
if [ ! -x "$VENV/bin/python" ]; then
  if [ "$system_gpu_ort" = 1 ]; then
    setup_say "creating $VENV with --system-site-packages: ${PYTHON}'s onnxruntime-gpu is the one used"
  else
    setup_say "creating $VENV"
  fi
  "$PYTHON" -m venv "${venv_flags[@]}" "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  setup_say "installing edgespec[$extras] into $VENV (first run: a few minutes)"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e "$ROOT${extras:+[$extras]}"
  if [ "$EXPORT" = torch ]; then
    "$VENV/bin/python" -m pip install -q "torch==2.13.0"
    "$VENV/bin/python" -m pip install -q -e "$ROOT/export[torch]"
  elif [ "$EXPORT" = 1 ]; then
    "$VENV/bin/python" -m pip install -q -e "$ROOT/export"
  fi
  if [ "$gpu_board" = 1 ] && [ "$ORT_GPU" != 0 ] && ! cuda_ort "$VENV/bin/python"; then
    fetch="pip download --no-deps -d /tmp/ort-gpu '$ort_req' --index-url $ort_index && pip install /tmp/ort-gpu/onnxruntime_gpu-*.whl"
    if [ "$ort_source" = jp6-cu126 ]; then
      setup_say "no onnxruntime with CUDA in $VENV: fetching NVIDIA's onnxruntime-gpu for JetPack $jetpack ($ort_index)"
      rm -rf /tmp/ort-gpu
      if "$VENV/bin/python" -m pip download -q --no-deps -d /tmp/ort-gpu "$ort_req" --index-url "$ort_index" \
        && "$VENV/bin/python" -m pip install -q /tmp/ort-gpu/onnxruntime_gpu-*.whl; then
        setup_say "installed $(cd /tmp/ort-gpu && ls onnxruntime_gpu-*.whl)"
      else
        setup_say "could not fetch it (offline?): run later in the venv: $fetch"
      fi
    else
      setup_say "no onnxruntime with CUDA in $VENV, and L4T ${l4t:-unknown} (JetPack ${jetpack:-unknown}): ${ort_what:-no" \
        "onnxruntime-gpu known for it}; nothing installed; \`edgespec doctor\` says what this board takes (docs/jetson.md);" \
        "the CPU wheel, if you want it: pip install 'edgespec[cpu]'"
    fi
  fi
  echo "$want" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
