#!/usr/bin/env bash
# The device runtime's tests on aarch64: an arm64 Debian rootfs run under qemu user-mode emulation
# (scripts/arm64-env.sh, vendored from shared/tools), with tiny bundles prebuilt here on x86_64 (the torch export path
# needs torch, which the arm64 environment does not have; tests that need it skip there). The native GGUF exporter
# needs no torch: its tests (tiny GGUFs exported, verified and decoded) run in the guest, and with ARM64_SMOLLM2=1
# the guest also exports the real SmolLM2-135M GGUF from the host's model cache natively and verifies it.
#
#   scripts/test-arm64.sh                   the runtime tests (not slow), on an emulated Cortex-A72 (Pi 4)
#   scripts/test-arm64.sh tests/core/test_runner.py -k step     any pytest arguments instead
#   QEMU_CPU=cortex-a76 scripts/test-arm64.sh              Pi 5 cores (neoverse-n1 ~ Jetson Orin)
#
# Needs root (chroot, binfmt_misc) and Debian's qemu-user-static, binfmt-support and mmdebstrap, which
# arm64-env.sh installs with apt-get when missing. The first run builds the rootfs (~8 min, ~700 MB under
# ~/.cache/edgespec-arm64); later runs reuse it. Emulation is ~100x slower than native for numeric work.
# Environment: ARM64_ENV (path of arm64-env.sh), EDGESPEC_ARM64_BUNDLES (where the tiny bundles go),
# PYTHON (the x86_64 python with the export extra, default: the project's .venv).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
t_start=$SECONDS
log() { printf '[test-arm64] %s\n' "$*" >&2; }

ENV_SH=${ARM64_ENV:-}
for cand in "$ROOT/scripts/arm64-env.sh" "$ROOT/../shared/tools/arm64-env.sh"; do
  [ -n "$ENV_SH" ] || { [ -x "$cand" ] && ENV_SH=$cand; } || true
done
[ -n "$ENV_SH" ] && [ -x "$ENV_SH" ] || { log "arm64-env.sh not found (set ARM64_ENV)"; exit 2; }
[ "$(id -u)" = 0 ] || { log "needs root (chroot, mount, binfmt_misc)"; exit 2; }

CACHE=${ARM64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgespec-arm64}
mkdir -p "$CACHE"  # mmdebstrap wants the rootfs' parent folder to exist
# what the guest needs: the runtime (onnxruntime numpy tokenizers jinja2), the server extra, the test tools
export ARM64_PIP_PACKAGES=${ARM64_PIP_PACKAGES:-"onnxruntime numpy tokenizers onnx onnx-ir gguf==0.19.0 tqdm jinja2 llguidance pytest pytest-timeout starlette uvicorn httpx openai psutil scipy"}

# 1. tiny bundles, built here (x86_64, torch) and keyed by the code that writes them
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
key=$(cat export/edgespec_export/*.py edgespec/models/manifest.py tests/tiny_bundles.py 2>/dev/null | sha256sum | cut -c1-12)
BUNDLES=${EDGESPEC_ARM64_BUNDLES:-$CACHE/tiny-bundles-$key}
if [ ! -e "$BUNDLES/.complete" ]; then
  log "building tiny bundles in $BUNDLES"
  mkdir -p "$BUNDLES"
  "$PY" tests/tiny_bundles.py "$BUNDLES" >/dev/null
  touch "$BUNDLES/.complete"
fi

# 2. a clean copy of the working tree (tracked + untracked, not ignored: no x86 .venv, no caches)
STAGE=$(mktemp -d /tmp/edgespec-arm64-src.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
chmod 755 "$STAGE"  # tests that drop to `nobody` (the kiosk launcher) must reach the tree
git ls-files -z -co --exclude-standard | xargs -0 -I{} cp --parents -P -- {} "$STAGE"/ 2>/dev/null || true
mkdir -p "$STAGE/.arm64-bin"
printf '#!/bin/sh\nexec python -m edgespec "$@"\n' > "$STAGE/.arm64-bin/edgespec"
chmod +x "$STAGE/.arm64-bin/edgespec"

# 3. the tests, inside the emulated aarch64 Debian
if [ $# -eq 0 ]; then
  set -- tests -m "not slow and not realmodel"
fi
log "running pytest $* on emulated aarch64 (QEMU_CPU=${QEMU_CPU:-cortex-a72})"
GUEST_ENV=(-e EDGESPEC_TEST_BUNDLES=/bundles -e PYTHONPATH=/src:/src/export -e EDGESPEC_HOME=/tmp/edgespec-home
           -e "PATH=/src/.arm64-bin:/opt/venv/bin:/usr/local/bin:/usr/bin:/bin" -e EDGESPEC_ARM64=1)
set +e
"$ENV_SH" run -b "$STAGE:/src" -b "$BUNDLES:/bundles" -w /src "${GUEST_ENV[@]}" \
  -- python -m pytest -p no:cacheprovider -q -rs "$@"
rc=$?
SMOL=${EDGESPEC_HOME:-$HOME/.cache/edgespec}/models/smollm2-135m-instruct.gguf
if [ "$rc" = 0 ] && [ "${ARM64_SMOLLM2:-0}" = 1 ] && [ -f "$SMOL" ]; then
  log "native export of $(basename "$SMOL") on emulated aarch64 (no torch), then verify"
  "$ENV_SH" run -b "$STAGE:/src" -b "$(dirname "$SMOL"):/models" -w /src "${GUEST_ENV[@]}" \
    -- sh -c 'python -m edgespec export /models/smollm2-135m-instruct.gguf -o /tmp/smollm2 --overwrite -q --parity-tokens 128 &&
              python -m edgespec verify /tmp/smollm2 --load'
  rc=$?
fi
set -e
log "done in $((SECONDS - t_start)) s (exit $rc)"
exit $rc
