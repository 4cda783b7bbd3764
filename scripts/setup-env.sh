#!/usr/bin/env bash
# Creates .venv (once) and installs edgespec with its extras, and the export half (export/).
# Sourced by quickstart.sh and test.sh.
#   EXTRAS=server,test  (default: all)   PYTHON=python3.11
#   EXPORT=1 (default: the export half's base install, which exports .gguf files natively, no torch)
#   EXPORT=torch (also its [torch] extra: Hugging Face sources, --via torch, the test suite's tiny bundles)
#   EXPORT=0 (the device runtime alone)
# With EXPORT=torch, torch is installed first, and pinned: a CPU build of 2.13.0 is what the export path was tested
# with, and a plain `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${EDGESPEC_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-all}
EXPORT=${EXPORT:-1}
STAMP=$VENV/.edgespec-installed

want=$( (cat "$ROOT/pyproject.toml" "$ROOT/export/pyproject.toml"; echo "$EXTRAS $EXPORT") | sha256sum | cut -c1-16)
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing edgespec[$EXTRAS] into $VENV (first run: a few minutes)" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e "$ROOT[$EXTRAS]"
  if [ "$EXPORT" = torch ]; then
    "$VENV/bin/python" -m pip install -q "torch==2.13.0"
    "$VENV/bin/python" -m pip install -q -e "$ROOT/export[torch]"
  elif [ "$EXPORT" = 1 ]; then
    "$VENV/bin/python" -m pip install -q -e "$ROOT/export"
  fi
  echo "$want" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
