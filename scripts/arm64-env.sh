#!/usr/bin/env bash
# Vendored from the team's shared/tools (so CI needs nothing outside the checkout); one fix: the rootfs'
# parent folder is created before mmdebstrap runs.
# arm64-env.sh - an arm64 (aarch64) Debian rootfs run under qemu user-mode
# emulation, with a Python venv holding onnxruntime/numpy/tokenizers.
#
#   arm64-env.sh build                      build rootfs + venv if missing (idempotent)
#   arm64-env.sh run [opts] [--] CMD ARGS   build if missing, then run CMD inside
#       -b, --bind HOST[:GUEST]    bind-mount HOST dir read-write (default GUEST=/mnt/<basename>)
#       -c, --copy HOST[:GUEST]    copy HOST dir into the rootfs instead (results stay in rootfs)
#       -w, --workdir GUEST        cwd inside (default: first bind/copy target, else /)
#       -e, --env VAR=VAL          extra environment variable (repeatable)
#   arm64-env.sh shell [opts]               interactive bash inside (same opts as run)
#   arm64-env.sh info                       paths, sizes, versions
#   arm64-env.sh clean                      delete the rootfs
#
# Environment knobs (defaults in brackets):
#   ARM64_ROOTFS [~/.cache/edgespec-arm64/rootfs]   ARM64_SUITE [bookworm]
#   ARM64_MIRROR [empty: the host's apt sources]   ARM64_BUILDER [mmdebstrap|debootstrap]
#   ARM64_PIP_PACKAGES ["onnxruntime numpy tokenizers onnx onnx-ir"]
#   QEMU_CPU [cortex-a72]  (Pi 4 = cortex-a72, Pi 5 ~ cortex-a76, Orin ~ neoverse-n1;
#                           'max' enables SVE and makes OpenBLAS raise spurious FP warnings)
#   ARM64_NO_BINFMT=1      force the no-binfmt fallback (qemu-aarch64-static run explicitly;
#                           only the first process is emulated, child exec()s of arm64
#                           binaries then fail, and the rootfs cannot be built that way)
set -euo pipefail

CACHE=${ARM64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgespec-arm64}
ROOTFS=${ARM64_ROOTFS:-$CACHE/rootfs}
SUITE=${ARM64_SUITE:-bookworm}
MIRROR=${ARM64_MIRROR:-}
BUILDER=${ARM64_BUILDER:-mmdebstrap}
PIP_PACKAGES=${ARM64_PIP_PACKAGES:-onnxruntime numpy tokenizers onnx onnx-ir}
QEMU_CPU=${QEMU_CPU:-cortex-a72}
VENV=/opt/venv
STAMP=$ROOTFS/.armcheck
DEBS=python3,python3-venv,ca-certificates

log() { printf '[arm64-env] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (chroot, mount, binfmt_misc)"

host_deps() {
  local missing=()
  command -v qemu-aarch64-static >/dev/null || missing+=(qemu-user-static)
  command -v update-binfmts >/dev/null || missing+=(binfmt-support)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
  command -v unshare >/dev/null || missing+=(util-linux)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing host packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# 0 = aarch64 ELF files can be exec()ed transparently (binfmt_misc + qemu)
binfmt_setup() {
  [ "${ARM64_NO_BINFMT:-0}" = 1 ] && return 1
  local bm=/proc/sys/fs/binfmt_misc
  if [ ! -e $bm/register ]; then
    mount -t binfmt_misc binfmt_misc $bm 2>/dev/null || { log "cannot mount binfmt_misc"; return 1; }
  fi
  if [ ! -e $bm/qemu-aarch64 ]; then
    update-binfmts --enable qemu-aarch64 2>/dev/null ||
      { [ -r /usr/lib/binfmt.d/qemu-aarch64.conf ] && cat /usr/lib/binfmt.d/qemu-aarch64.conf > $bm/register; } ||
      { log "cannot register qemu-aarch64 in binfmt_misc"; return 1; }
  fi
  grep -q '^enabled' $bm/qemu-aarch64 || echo 1 > $bm/qemu-aarch64
  grep -q '^enabled' $bm/status || echo 1 > $bm/status
  return 0
}

# Fake /proc/cpuinfo: qemu 7.2 shows the *host* (x86) /proc/cpuinfo to the guest and
# onnxruntime's cpuinfo library segfaults on it at `import onnxruntime`.
cpuinfo_file() {
  local part name f=$CACHE/cpuinfo/$QEMU_CPU.cpuinfo
  case $QEMU_CPU in
    cortex-a72) part=0xd08 name="Raspberry Pi 4 Model B (emulated)";;
    cortex-a76) part=0xd0b name="Raspberry Pi 5 Model B (emulated)";;
    neoverse-n1) part=0xd0c name="emulated neoverse-n1";;
    cortex-a57) part=0xd07 name="emulated cortex-a57";;
    cortex-a53) part=0xd03 name="emulated cortex-a53";;
    *) part=0xd0c name="emulated $QEMU_CPU";;
  esac
  if [ ! -s "$f" ]; then
    mkdir -p "$CACHE/cpuinfo"
    { for i in $(seq 0 $(( $(nproc) - 1 ))); do
        printf 'processor\t: %d\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n' "$i"
        printf 'CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: %s\nCPU revision\t: 3\n\n' "$part"
      done
      printf 'Model\t\t: %s\n' "$name"; } > "$f"
  fi
  echo "$f"
}

guest_env() {  # env -i arguments used for every command inside the rootfs
  echo "PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
       "HOME=/root LANG=C.UTF-8 TERM=${TERM:-dumb} QEMU_CPU=$QEMU_CPU" \
       "SSL_CERT_FILE=/etc/ssl/certs/host-ca-bundle.crt PIP_CERT=/etc/ssl/certs/host-ca-bundle.crt" \
       "PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 PYTHONDONTWRITEBYTECODE=1"
}

# chroot_exec BINFMT(0/1) SETUP_SCRIPT WORKDIR EXTRA_ENV CMD... : run CMD in the rootfs
# inside a private mount namespace (all mounts vanish when it exits, even on errors).
# env/unshare are the host's binaries, so no arm64 wrapper process is needed; without
# binfmt the static qemu inside the rootfs is exec'ed explicitly.
chroot_exec() {
  local binfmt=$1 setup=$2 wd=$3 extra=$4; shift 4
  local cpuinfo; cpuinfo=$(cpuinfo_file)
  local qemu=()
  [ "$binfmt" = 1 ] || qemu=(/usr/bin/qemu-aarch64-static -cpu "$QEMU_CPU")
  # shellcheck disable=SC2016
  unshare --mount --propagation private -- bash -euc '
    R=$1; cpuinfo=$2; setup=$3; wd=$4; shift 4
    mount -t proc proc "$R/proc"
    mount --bind "$cpuinfo" "$R/proc/cpuinfo"
    mount -t sysfs sysfs "$R/sys" 2>/dev/null || true
    mount --rbind /dev "$R/dev"
    cp -L /etc/resolv.conf "$R/etc/resolv.conf" 2>/dev/null || true
    eval "$setup"
    exec "$@"' _ "$ROOTFS" "$cpuinfo" "$setup" "$wd" \
      env -i $(guest_env) $extra unshare --root="$ROOTFS" --wd="$wd" -- "${qemu[@]}" "$@"
}

build() {
  host_deps
  binfmt_setup || die "binfmt_misc for aarch64 unavailable: the rootfs cannot be built here \
(debootstrap/mmdebstrap need transparent exec of arm64 binaries); copy a prebuilt rootfs to $ROOTFS"
  local t0=$SECONDS
  if [ ! -e "$STAMP/base.done" ]; then
    rm -rf "$ROOTFS"
    mkdir -p "$(dirname "$ROOTFS")"  # mmdebstrap refuses a target whose parent does not exist
    log "building $SUITE arm64 rootfs with $BUILDER at $ROOTFS"
    case $BUILDER in
      mmdebstrap)
        mmdebstrap --mode=root --arch=arm64 --variant=minbase --include=$DEBS \
          "$SUITE" "$ROOTFS" ${MIRROR:+"$MIRROR"} ;;
      debootstrap)
        debootstrap --arch=arm64 --foreign --variant=minbase --include=$DEBS "$SUITE" "$ROOTFS" ${MIRROR:+"$MIRROR"}
        cp /usr/bin/qemu-aarch64-static "$ROOTFS/usr/bin/"   # for the no-binfmt fallback / old setups
        echo force-unsafe-io > "$ROOTFS/etc/dpkg/dpkg.cfg.d/armcheck-unsafe-io"
        chroot "$ROOTFS" /debootstrap/debootstrap --second-stage ;;
      *) die "unknown ARM64_BUILDER=$BUILDER" ;;
    esac
    cp /usr/bin/qemu-aarch64-static "$ROOTFS/usr/bin/" 2>/dev/null || true
    mkdir -p "$STAMP"; touch "$STAMP/base.done"
    log "base rootfs done in $((SECONDS - t0)) s"
  fi
  # the host CA bundle (may contain a site proxy CA) for pip inside the rootfs
  cp -L /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/host-ca-bundle.crt"
  if [ "$(cat "$STAMP/pip.done" 2>/dev/null)" != "$PIP_PACKAGES" ]; then
    local t1=$SECONDS
    log "creating $VENV and pip installing: $PIP_PACKAGES"
    chroot_exec 1 : / "" /bin/sh -ec "[ -x $VENV/bin/python ] || python3 -m venv $VENV
      $VENV/bin/pip install --no-cache-dir $PIP_PACKAGES"
    echo "$PIP_PACKAGES" > "$STAMP/pip.done"
    log "venv done in $((SECONDS - t1)) s"
  fi
}

run() {
  local setup="" workdir="" envs=() a host guest
  while [ $# -gt 0 ]; do
    case $1 in
      -b|--bind|-c|--copy)
        a=$2; host=${a%%:*}; guest=${a#*:}; [ "$guest" = "$a" ] && guest=/mnt/$(basename "$host")
        host=$(cd "$host" && pwd) || die "no such dir: $a"
        if [ "$1" = -b ] || [ "$1" = --bind ]; then
          setup+="mkdir -p \"\$R$guest\"; mount --bind \"$host\" \"\$R$guest\";"
        else
          setup+="rm -rf \"\$R$guest\"; mkdir -p \"\$R$guest\"; cp -a \"$host/.\" \"\$R$guest/\";"
        fi
        [ -n "$workdir" ] || workdir=$guest; shift 2 ;;
      -w|--workdir) workdir=$2; shift 2 ;;
      -e|--env) envs+=("$2"); shift 2 ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || set -- /bin/bash
  local binfmt=1
  if binfmt_setup; then build; else
    binfmt=0
    [ -e "$STAMP/pip.done" ] || die "no binfmt_misc and no prebuilt rootfs at $ROOTFS"
    log "binfmt_misc unavailable: running the first process via qemu-aarch64-static explicitly"
    [ "${1#/}" != "$1" ] || die "without binfmt CMD must be an absolute path to an arm64 ELF (e.g. $VENV/bin/python)"
  fi
  chroot_exec $binfmt "$setup" "${workdir:-/}" "${envs[*]:-}" "$@"
}

info() {
  echo "rootfs:   $ROOTFS"
  echo "builder:  $BUILDER   suite: $SUITE   QEMU_CPU: $QEMU_CPU"
  echo "binfmt:   $(cat /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null | head -2 | tr '\n' ' ' || echo none)"
  [ -d "$ROOTFS" ] && echo "size:     $(du -shx "$ROOTFS" | cut -f1) (venv $(du -shx "$ROOTFS$VENV" 2>/dev/null | cut -f1))"
  echo "pip:      $(cat "$STAMP/pip.done" 2>/dev/null || echo 'not built')"
}

cmd=${1:-help}; shift || true
case $cmd in
  build) build ;;
  run) run "$@" ;;
  shell) run "$@" -- /bin/bash ;;
  info) info ;;
  clean) rm -rf "$ROOTFS" ;;
  *) sed -n '2,26p' "$0"; exit 2 ;;
esac
