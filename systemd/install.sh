#!/usr/bin/env bash
# Installs edgespec as a systemd service that serves one bundle on http://127.0.0.1:8000.
#
#   sudo ./systemd/install.sh BUNDLE                 # venv in /opt/edgespec/venv, bundle copied, service started
#   sudo ./systemd/install.sh --kiosk BUNDLE         # also the chat page full screen (edgespec-kiosk.service)
#   sudo ./systemd/install.sh --api-key-file /etc/edgespec/api-key BUNDLE    # require a bearer token
#   sudo ./systemd/install.sh --system-site-packages BUNDLE   # a Jetson whose system python has onnxruntime-gpu
#   sudo ./systemd/install.sh --jetson-clocks BUNDLE  # a Jetson: clocks pinned at the power mode's maximum first
#
# What it writes: /opt/edgespec/{venv,bundles/NAME}, /etc/edgespec/edgespec.env (kept if present: only the
# options given here are changed in it), /etc/systemd/system/edgespec.service and drop-ins in
# /etc/systemd/system/edgespec.service.d/ (api-key.conf, network.conf; on a Jetson memory.conf, the board's
# memory budget as the cap, and jetson-clocks.conf with --jetson-clocks). Run it again to update.
# Uninstall: systemctl disable --now edgespec; rm -r /etc/systemd/system/edgespec.service* /opt/edgespec
set -euo pipefail

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PREFIX=/opt/edgespec
PYTHON=python3
VENV=
PIP=1
SYSTEM_SITE=
API_KEY_FILE=
HOST=
PORT=
KIOSK=0
START=1
ROOT=
BUNDLE=
PRINT_PIP=0
JETSON_CLOCKS=

usage() { sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; cat <<'EOF'
Options:
  --prefix DIR             where the venv and bundles go (default /opt/edgespec)
  --python PY              interpreter that creates the venv (default python3; 3.10 or newer)
  --system-site-packages   the venv also sees system packages (an onnxruntime-gpu pip-installed for the
                           system python: JetPack itself ships none)
  --venv DIR               use this existing environment, where edgespec[server] is installed (no pip)
  --no-pip                 use PREFIX/venv as it is (no pip install)
  --api-key-file FILE      require 'Authorization: Bearer <key>'; FILE holds the key (given to the
                           service with LoadCredential=, so FILE can stay root-only: chmod 600)
  --host ADDR              listen address (default 127.0.0.1); any other address also lets LAN traffic in
  --port N                 TCP port (default 8000)
  --kiosk                  serve the kiosk page and install edgespec-kiosk.service
  --no-start               install and enable, but do not (re)start now
  --root DIR               write into the file tree DIR (an image being built); no systemctl, no pip
  --print-pip              print the pip install line this venv would get (which extras) and exit
  --jetson-clocks          a Jetson: run jetson_clocks (as root) before each start, pinning CPU, GPU and memory
                           clocks at the power mode's maximum: steadier step times, more power (--no-jetson-clocks
                           removes it)

The venv gets edgespec[server], plus the CPU onnxruntime (edgespec[server,cpu]) only where it sees no
onnxruntime at all and this is not a Jetson: a Jetson's onnxruntime-gpu (seen with --system-site-packages,
or installed into the venv before) stays the one used, never shadowed by the CPU wheel, and a Jetson venv
without one is refused with the lines that install NVIDIA's wheel into it (docs/jetson.md).
EOF
}

die() { echo "install.sh: error: $*" >&2; exit 1; }
say() { echo "[install] $*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) PREFIX=${2:?}; shift 2 ;;
    --python) PYTHON=${2:?}; shift 2 ;;
    --system-site-packages) SYSTEM_SITE=--system-site-packages; shift ;;
    --venv) VENV=${2:?}; PIP=0; shift 2 ;;
    --no-pip) PIP=0; shift ;;
    --api-key-file) API_KEY_FILE=${2:?}; shift 2 ;;
    --host) HOST=${2:?}; shift 2 ;;
    --port) PORT=${2:?}; shift 2 ;;
    --kiosk) KIOSK=1; shift ;;
    --no-start) START=0; shift ;;
    --root) ROOT=${2:?}; PIP=0; START=0; shift 2 ;;
    --print-pip) PRINT_PIP=1; shift ;;
    --jetson-clocks) JETSON_CLOCKS=1; shift ;;
    --no-jetson-clocks) JETSON_CLOCKS=0; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$BUNDLE" ] || die "one bundle only (got '$BUNDLE' and '$1')"; BUNDLE=$1; shift ;;
  esac
done

TEGRA_RELEASE=${EDGESPEC_TEGRA_RELEASE:-/etc/nv_tegra_release}  # a Jetson's (tests point it at a fake file)
# A venv's python sees an onnxruntime: a module with a file (a leftover onnxruntime/ folder of a removed wheel
# is none).
has_ort() {
  "$1" -c 'import importlib.util as u, sys; s = u.find_spec("onnxruntime"); sys.exit(0 if s and s.origin else 1)' \
    2>/dev/null
}
# The extras for a venv's python: the CPU onnxruntime only where none is importable and this is no Jetson, so a
# GPU build present, or the one a Jetson should get, is never shadowed.
extras_for() {
  if has_ort "$1" || [ -r "$TEGRA_RELEASE" ]; then
    echo server
  else
    echo server,cpu
  fi
}
[ -z "$VENV" ] && VENV=$PREFIX/venv
if [ "$PRINT_PIP" = 1 ]; then
  py=$VENV/bin/python3
  [ -x "$py" ] || py=$PYTHON
  echo "$py -m pip install '${SRC}[$(extras_for "$py")]'"
  exit 0
fi

[ -n "$BUNDLE" ] || { usage >&2; die "no bundle given"; }
[ -f "$BUNDLE/manifest.json" ] || die "$BUNDLE is not a bundle (no manifest.json); create one with 'edgespec export' or 'edgespec pull'"
BUNDLE=$(cd "$BUNDLE" && pwd)
NAME=$(basename "$BUNDLE")
case "$NAME" in *[!A-Za-z0-9._-]*) die "bundle folder name '$NAME' must use only letters, digits, '.', '_' and '-'" ;; esac
case "$PREFIX" in /*) ;; *) die "--prefix must be an absolute path" ;; esac
case "$VENV" in /*) ;; *) die "--venv must be an absolute path" ;; esac
if [ -n "$PORT" ]; then
  case "$PORT" in ''|*[!0-9]*) die "--port must be a number" ;; esac
  [ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ] || die "--port must be 1..65535"
fi
if [ -n "$API_KEY_FILE" ]; then
  case "$API_KEY_FILE" in /*) ;; *) API_KEY_FILE=$(cd "$(dirname "$API_KEY_FILE")" && pwd)/$(basename "$API_KEY_FILE") ;; esac
  [ -s "$ROOT$API_KEY_FILE" ] || die "API key file $API_KEY_FILE does not exist or is empty (e.g. 'openssl rand -hex 32 > $API_KEY_FILE; chmod 600 $API_KEY_FILE')"
  case "$(stat -c %a "$ROOT$API_KEY_FILE")" in *00) ;; *) say "warning: $API_KEY_FILE is readable by others: chmod 600 $API_KEY_FILE" ;; esac
fi
if [ "$JETSON_CLOCKS" = 1 ] && [ ! -r "$TEGRA_RELEASE" ]; then
  die "--jetson-clocks: this is not a Jetson (no $TEGRA_RELEASE)"
fi
if [ "$KIOSK" = 1 ]; then
  for f in edgespec-kiosk.service kiosk-browser.sh; do
    [ -f "$SRC/systemd/$f" ] || die "--kiosk: $SRC/systemd/$f is missing from this checkout"
  done
fi
if [ -z "$ROOT" ]; then
  [ "$(id -u)" = 0 ] || die "run as root (sudo $0 ...)"
  command -v systemctl >/dev/null || die "systemctl not found: this installer needs systemd"
fi

# --- 1. the Python environment -----------------------------------------------------------------
if [ "$PIP" = 1 ]; then
  command -v "$PYTHON" >/dev/null || die "$PYTHON not found (install python3 and python3-venv)"
  if [ ! -x "$VENV/bin/python3" ]; then
    say "creating $VENV"
    "$PYTHON" -m venv $SYSTEM_SITE "$VENV" || die "could not create a venv (Debian/Ubuntu: apt install python3-venv)"
  fi
  if [ -r "$TEGRA_RELEASE" ] && ! has_ort "$VENV/bin/python3"; then
    # the board's JetPack row (devices/_releases.json): where its onnxruntime-gpu comes from
    l4t=$(sed -n 's/^# R\([0-9]*\) (release), REVISION: \([0-9.]*\).*/\1.\2/p' "$TEGRA_RELEASE" | head -n1)
    IFS=$'\t' read -r jetpack ort_source ort_index ort_req ort_what \
      <<<"$("$PYTHON" "$SRC/edgespec/edge/releases.py" setup "${l4t:-unknown}" || true)"
    if [ "$ort_source" = jp6-cu126 ]; then
      die "a Jetson, and $VENV sees no onnxruntime: install NVIDIA's onnxruntime-gpu into it first (JetPack $jetpack):
  $VENV/bin/pip download --no-deps -d /tmp/ort-gpu '$ort_req' --index-url $ort_index
  $VENV/bin/pip install /tmp/ort-gpu/onnxruntime_gpu-*.whl
then run this again (never the CPU wheel here: it would take the GPU one's place; docs/jetson.md)"
    fi
    die "a Jetson (L4T ${l4t:-unknown}, JetPack ${jetpack:-unknown}), and $VENV sees no onnxruntime: ${ort_what:-no onnxruntime-gpu is known for it}. To run on the CPU meanwhile: $VENV/bin/pip install onnxruntime, then run this again"
  fi
  EXTRAS=$(extras_for "$VENV/bin/python3")
  [ "$EXTRAS" = server ] && say "$VENV sees an onnxruntime already (a Jetson's onnxruntime-gpu): not adding the CPU one"
  say "installing edgespec[$EXTRAS] from $SRC into $VENV"
  # build from a copy: setuptools writes build files into the source tree, which may be read-only
  # or belong to the user who cloned it (this script runs as root)
  BUILD=$(mktemp -d)
  trap 'rm -rf "$BUILD"' EXIT
  tar -C "$SRC" --exclude=./.venv --exclude=./.git --exclude=./build --exclude=./dist --exclude=./bundles \
    --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache -cf - . | tar -C "$BUILD" -xf -
  "$VENV/bin/python3" -m pip install -q --upgrade pip
  "$VENV/bin/python3" -m pip install -q "${BUILD}[$EXTRAS]"
fi
if [ -z "$ROOT" ]; then
  [ -x "$VENV/bin/python3" ] || die "$VENV/bin/python3 does not exist (drop --no-pip/--venv to create it)"
  "$VENV/bin/python3" -c 'import edgespec.server.service, uvicorn, starlette' 2>/dev/null \
    || die "edgespec[server] is not importable from $VENV (pip install '${SRC}[server]' into it, plus [cpu] where it has no onnxruntime)"
  # --- 2. the bundle, verified once here (every file's sha256) ------------------------------------
  say "verifying $BUNDLE"
  "$VENV/bin/python3" - "$BUNDLE" <<'EOF' || die "bundle $BUNDLE failed verification (see above); not installed"
import sys
from edgespec.models.bundle import Bundle
from edgespec.errors import EdgespecError
try:
    b = Bundle.open(sys.argv[1], verify=True)
except EdgespecError as e:
    print(e, file=sys.stderr)
    sys.exit(1)
print(f"[install] bundle {b.name}: ok", file=sys.stderr)
EOF
fi

DEST=$ROOT$PREFIX/bundles/$NAME
if [ "$BUNDLE" != "$DEST" ]; then
  say "copying the bundle to $PREFIX/bundles/$NAME"
  mkdir -p "$ROOT$PREFIX/bundles"
  rm -rf "$DEST.partial" "$DEST.old"
  cp -r "$BUNDLE" "$DEST.partial"
  chown -R 0:0 "$DEST.partial" 2>/dev/null || true
  chmod -R u=rwX,go=rX "$DEST.partial"
  # rename into place: the service never sees a half-copied bundle
  [ -e "$DEST" ] && mv "$DEST" "$DEST.old"
  mv "$DEST.partial" "$DEST"
  rm -rf "$DEST.old"
fi

# --- 3. settings ---------------------------------------------------------------------------------
ETC=$ROOT/etc/edgespec
ENVFILE=$ETC/edgespec.env
mkdir -p "$ETC"
if [ ! -f "$ENVFILE" ]; then
  install -m 0644 "$SRC/systemd/edgespec.env" "$ENVFILE"
  say "wrote $ENVFILE"
else
  say "keeping $ENVFILE (only the options given now are changed)"
fi
setvar() {  # setvar NAME VALUE: replace the line, or append it
  if grep -q "^$1=" "$ENVFILE"; then
    sed -i "s|^$1=.*|$1=$2|" "$ENVFILE"
  else
    echo "$1=$2" >> "$ENVFILE"
  fi
}
setvar EDGESPEC_BUNDLE "$PREFIX/bundles/$NAME"
[ -n "$HOST" ] && setvar EDGESPEC_HOST "$HOST"
[ -n "$PORT" ] && setvar EDGESPEC_PORT "$PORT"
[ "$KIOSK" = 1 ] && setvar EDGESPEC_UI 1

# --- 4. the unit and its drop-ins ------------------------------------------------------------------
UNITDIR=$ROOT/etc/systemd/system
mkdir -p "$UNITDIR/edgespec.service.d"
sed "s|/opt/edgespec/venv/bin/python3|$VENV/bin/python3|" "$SRC/systemd/edgespec.service" > "$UNITDIR/edgespec.service.tmp"
chmod 0644 "$UNITDIR/edgespec.service.tmp"
mv "$UNITDIR/edgespec.service.tmp" "$UNITDIR/edgespec.service"
if [ -n "$API_KEY_FILE" ]; then
  printf '[Service]\n# the bearer token; the server reads it from $CREDENTIALS_DIRECTORY/api-key\nLoadCredential=api-key:%s\n' \
    "$API_KEY_FILE" > "$UNITDIR/edgespec.service.d/api-key.conf"
  say "API key required (from $API_KEY_FILE)"
fi
if [ -n "$HOST" ]; then
  case "$HOST" in
    127.*|localhost|::1) rm -f "$UNITDIR/edgespec.service.d/network.conf" ;;
    *) printf '[Service]\n# listening on %s: let other machines in (the unit allows only localhost otherwise)\nIPAddressAllow=any\n' \
         "$HOST" > "$UNITDIR/edgespec.service.d/network.conf"
       [ -n "$API_KEY_FILE" ] || [ -f "$UNITDIR/edgespec.service.d/api-key.conf" ] \
         || say "warning: listening on $HOST without an API key: anyone on the network can use the model" ;;
  esac
fi
# the board: where the GPU shares the RAM (a Jetson), CUDA's memory is not what the unit's percentages of RAM
# were sized for, so the cap is the board's memory budget (memory less the profile's reserve for the OS and the
# CUDA context: the number the engine's plan keeps CPU and GPU memory within), read by edgespec's own detection
py=$PYTHON
[ -x "$VENV/bin/python3" ] && py=$VENV/bin/python3
budget=$(PYTHONPATH=$SRC "$py" - "${EDGESPEC_BOARD_ROOT:-/}" 2>/dev/null <<'EOF' || true
import sys
from edgespec.edge import devices
p = devices.detect(sys.argv[1])
if p.memory_shared_with_gpu and p.memory_budget_bytes:
    print(p.memory_budget_bytes)
EOF
)
if [ -n "$budget" ]; then
  cat > "$UNITDIR/edgespec.service.d/memory.conf" <<EOF
[Service]
# the GPU shares this board's RAM: the cap is the board's memory budget (edgespec doctor, "default budget"),
# not a share of RAM sized without CUDA's allocations
MemoryHigh=$((budget / 10 * 9))
MemoryMax=$budget
EOF
  say "the GPU shares the memory: MemoryMax=$budget bytes, the board's budget (memory.conf)"
else
  rm -f "$UNITDIR/edgespec.service.d/memory.conf"
fi
if [ "$JETSON_CLOCKS" = 1 ]; then
  cat > "$UNITDIR/edgespec.service.d/jetson-clocks.conf" <<'EOF'
[Service]
# install.sh --jetson-clocks: CPU, GPU and memory clocks pinned at the power mode's maximum before the model
# loads (as root: "+"; a board without jetson_clocks still starts the service: "-")
ExecStartPre=-+/usr/bin/jetson_clocks
EOF
  say "jetson_clocks runs before each start (jetson-clocks.conf; --no-jetson-clocks removes it)"
elif [ "$JETSON_CLOCKS" = 0 ]; then
  rm -f "$UNITDIR/edgespec.service.d/jetson-clocks.conf"
fi
if [ "$KIOSK" = 1 ]; then
  # the browser script the kiosk unit runs, and the unprivileged user it runs as
  install -m 0755 "$SRC/systemd/kiosk-browser.sh" "$ROOT$PREFIX/kiosk-browser.sh"
  sed "s|/opt/edgespec/kiosk-browser.sh|$PREFIX/kiosk-browser.sh|" "$SRC/systemd/edgespec-kiosk.service" \
    > "$UNITDIR/edgespec-kiosk.service"
  chmod 0644 "$UNITDIR/edgespec-kiosk.service"
  if [ ! -f "$ETC/kiosk.env" ]; then
    kport=$(sed -n 's/^EDGESPEC_PORT=//p' "$ENVFILE" | tail -n 1)
    printf '# edgespec kiosk settings (see docs/kiosk.md)\nEDGESPEC_KIOSK_URL=http://127.0.0.1:%s/\n' "${kport:-8000}" \
      > "$ETC/kiosk.env"
  fi
  if [ -z "$ROOT" ]; then
    if ! id edgespec-kiosk >/dev/null 2>&1; then
      useradd --system --no-create-home --home-dir /run/edgespec-kiosk --shell /usr/sbin/nologin edgespec-kiosk
    fi
    for g in video render input; do
      getent group "$g" >/dev/null && usermod -a -G "$g" edgespec-kiosk
    done
    command -v cage >/dev/null || say "warning: cage is not installed (apt install cage)"
    command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
      || say "warning: Chromium is not installed (apt install chromium)"
  fi
  if [ -n "$API_KEY_FILE" ] || [ -f "$UNITDIR/edgespec.service.d/api-key.conf" ]; then
    say "API key set: the kiosk page is admitted on this device by its session cookie, other clients need the key"
  fi
  say "installed edgespec-kiosk.service (the chat page full screen on tty1)"
fi

[ -n "$ROOT" ] && { say "files written under $ROOT"; exit 0; }

# --- 5. start ---------------------------------------------------------------------------------------
systemctl daemon-reload
systemctl enable edgespec.service >/dev/null
[ "$KIOSK" = 1 ] && systemctl enable edgespec-kiosk.service >/dev/null
if [ "$START" = 0 ]; then
  say "installed and enabled; start it with: systemctl start edgespec"
  exit 0
fi
say "starting edgespec (loads and warms up the model; READY when it answers)"
if ! systemctl restart edgespec.service; then
  systemctl --no-pager status edgespec.service >&2 || true
  die "edgespec did not start; see: journalctl -u edgespec -n 50"
fi
[ "$KIOSK" = 1 ] && systemctl restart edgespec-kiosk.service
host=$(sed -n 's/^EDGESPEC_HOST=//p' "$ENVFILE" | tail -n 1)
port=$(sed -n 's/^EDGESPEC_PORT=//p' "$ENVFILE" | tail -n 1)
say "running: curl -s http://${host:-127.0.0.1}:${port:-8000}/v1/models"
systemctl --no-pager status edgespec.service | head -n 5 >&2 || true
