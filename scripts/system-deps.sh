#!/usr/bin/env bash
# Debian packages the slow tests use: Chromium (kiosk page test), systemd-container + mmdebstrap (a real
# systemd in systemd-nspawn), qemu-user-static + binfmt-support (the emulated aarch64 runtime tests),
# and the shell linter (scripts/gpu-check.sh, the one script a GPU session runs unattended, lints clean).
# Installs only what is missing; without root it only says what is missing (those tests then skip).
set -euo pipefail
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v cage >/dev/null || need+=(cage)          # the kiosk launcher under a real compositor
command -v Xwayland >/dev/null || need+=(xwayland)  # Debian's cage does not start without it
command -v systemd-nspawn >/dev/null || need+=(systemd-container)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v update-binfmts >/dev/null || need+=(binfmt-support)
command -v unshare >/dev/null || need+=(util-linux)
command -v shellcheck >/dev/null || need+=(shellcheck)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "[system-deps] not root: missing ${need[*]} (the tests that need them will skip)" >&2
  exit 0
fi
echo "[system-deps] apt-get install ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
