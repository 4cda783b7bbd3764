#!/bin/sh
# Installs the kiosk browser part: the launcher, edgespec-kiosk.service, its settings file and its
# user. Called by `install.sh --kiosk` (which also turns the page on with EDGESPEC_UI=1 and enables
# and starts the unit); can be run alone:
#
#   sudo ./systemd/kiosk-install.sh [--prefix /opt/edgespec] [--port 8000] [--root DIR]
#
# Writes: PREFIX/kiosk-browser.sh, /etc/systemd/system/edgespec-kiosk.service (ExecStart pointing at
# PREFIX), /etc/edgespec/kiosk.env (kept if present; --port rewrites the URL's port),
# /etc/sysusers.d/edgespec-kiosk.conf (the user edgespec-kiosk, in groups video, render, input).
# With --root DIR everything goes under DIR (an image being built) and the user is created there.
set -eu

SRC=$(cd "$(dirname "$0")" && pwd)
PREFIX=/opt/edgespec
PORT=
ROOT=

die() { echo "kiosk-install.sh: error: $*" >&2; exit 1; }
say() { echo "[kiosk] $*" >&2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) PREFIX=${2:?--prefix needs a folder}; shift 2 ;;
    --port) PORT=${2:?--port needs a number}; shift 2 ;;
    --root) ROOT=${2:?--root needs a folder}; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
case "$PREFIX" in /*) ;; *) die "--prefix must be an absolute path" ;; esac
case "$PREFIX" in *[!A-Za-z0-9/._-]*) die "--prefix may only use letters, digits and / . _ -" ;; esac
if [ -n "$PORT" ]; then
  case "$PORT" in ''|*[!0-9]*) die "--port must be a number" ;; esac
  if [ "$PORT" -lt 1 ] || [ "$PORT" -gt 65535 ]; then die "--port must be 1..65535"; fi
fi
if [ -n "$ROOT" ]; then
  [ -d "$ROOT" ] || die "--root $ROOT is not a folder"
  ROOT=$(cd "$ROOT" && pwd)
elif [ "$(id -u)" != 0 ]; then
  die "run as root (or with --root DIR to write into a file tree)"
fi

# the launcher and the unit (its ExecStart follows PREFIX)
mkdir -p "$ROOT$PREFIX" "$ROOT/etc/systemd/system" "$ROOT/etc/edgespec" "$ROOT/etc/sysusers.d"
install -m 0755 "$SRC/kiosk-browser.sh" "$ROOT$PREFIX/kiosk-browser.sh"
sed "s|^ExecStart=/opt/edgespec/kiosk-browser.sh\$|ExecStart=$PREFIX/kiosk-browser.sh|" \
  "$SRC/edgespec-kiosk.service" > "$ROOT/etc/systemd/system/edgespec-kiosk.service.tmp"
chmod 0644 "$ROOT/etc/systemd/system/edgespec-kiosk.service.tmp"
mv "$ROOT/etc/systemd/system/edgespec-kiosk.service.tmp" "$ROOT/etc/systemd/system/edgespec-kiosk.service"
say "installed $PREFIX/kiosk-browser.sh and edgespec-kiosk.service"

# settings: a user's edits survive a reinstall
ENVFILE=$ROOT/etc/edgespec/kiosk.env
if [ ! -f "$ENVFILE" ]; then
  install -m 0644 "$SRC/kiosk.env" "$ENVFILE"
  say "wrote /etc/edgespec/kiosk.env"
fi
if [ -n "$PORT" ]; then
  sed -i "s|^\(EDGESPEC_KIOSK_URL=https\{0,1\}://[^/:]*\)\(:[0-9]*\)\{0,1\}/|\1:$PORT/|" "$ENVFILE"
fi

# the user: declared for systemd-sysusers, so an image built with --root gets it at first boot too
cat > "$ROOT/etc/sysusers.d/edgespec-kiosk.conf" <<'CONF'
# edgespec-kiosk.service runs the kiosk browser as this user (docs/kiosk.md)
u edgespec-kiosk - "edgespec kiosk browser" /run/edgespec-kiosk /usr/sbin/nologin
m edgespec-kiosk video
m edgespec-kiosk render
m edgespec-kiosk input
CONF
if command -v systemd-sysusers >/dev/null 2>&1; then
  if [ -n "$ROOT" ]; then
    systemd-sysusers --root="$ROOT" /etc/sysusers.d/edgespec-kiosk.conf 2>/dev/null \
      || say "the user edgespec-kiosk will be created by systemd-sysusers at first boot"
  else
    systemd-sysusers /etc/sysusers.d/edgespec-kiosk.conf
  fi
else
  say "warning: systemd-sysusers not found; create the user yourself: useradd --system edgespec-kiosk"
fi

# what the unit needs at run time (not installed here: package names differ between distributions)
if [ -z "$ROOT" ]; then
  missing=
  command -v cage >/dev/null 2>&1 || missing="$missing cage"
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing="$missing chromium"
  [ -z "$missing" ] || say "warning: not installed:$missing (apt install$missing); the kiosk cannot start without them"
fi
