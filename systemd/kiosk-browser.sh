#!/bin/sh
# edgespec kiosk browser: waits until the edgespec chat page answers, then shows it full screen in
# Chromium with a fresh profile. Run by edgespec-kiosk.service; also usable from a desktop session's
# autostart (see docs/kiosk.md).
#
#   kiosk-browser.sh [URL]        URL defaults to $EDGESPEC_KIOSK_URL, else http://127.0.0.1:8000/
#
# In a graphical session (WAYLAND_DISPLAY or DISPLAY set) Chromium opens there. On a bare console
# (the service's case) it brings its own compositor: cage, a Wayland kiosk compositor.
#
# Settings, from the environment (the service reads /etc/edgespec/kiosk.env):
#   EDGESPEC_KIOSK_URL         the page; page settings go in its query, e.g. ?max_turns=10&idle_reset=300
#   EDGESPEC_KIOSK_BROWSER     Chromium's command (default: chromium, else chromium-browser)
#   EDGESPEC_KIOSK_FLAGS       extra Chromium flags, space-separated (e.g. --force-device-scale-factor=1.5)
#   EDGESPEC_KIOSK_PROFILE     profile folder, emptied at every start (default: $RUNTIME_DIRECTORY/profile,
#                              else $XDG_RUNTIME_DIR/edgespec-kiosk-profile)
#   EDGESPEC_KIOSK_WAIT        seconds to wait for the page before giving up (default 0: forever)
#   EDGESPEC_KIOSK_COMPOSITOR  the compositor command for a bare console (default: cage -d -s --)
#
# Exit status 78 (EX_CONFIG) means something is missing that restarting cannot fix; the unit's
# RestartPreventExitStatus=78 stops it from restarting in a loop then. Any other exit (the browser
# crashed or was closed) is restarted by the unit.
set -u
set -f  # no globbing: EDGESPEC_KIOSK_FLAGS and the compositor command are split into words, never globbed

URL=${1:-${EDGESPEC_KIOSK_URL:-http://127.0.0.1:8000/}}
WAIT=${EDGESPEC_KIOSK_WAIT:-0}
COMPOSITOR=${EDGESPEC_KIOSK_COMPOSITOR:-cage -d -s --}

say() { echo "kiosk-browser: $*" >&2; }
config_error() { say "error: $*"; exit 78; }

case "$URL" in
  http://*|https://*) ;;
  *) config_error "EDGESPEC_KIOSK_URL must be an http(s) URL, got '$URL'" ;;
esac
case "$WAIT" in
  ''|*[!0-9]*) config_error "EDGESPEC_KIOSK_WAIT must be a whole number of seconds, got '$WAIT'" ;;
esac
if [ "$(id -u)" = 0 ]; then
  config_error "refusing to run the browser as root; run it as an unprivileged user (the unit uses edgespec-kiosk)"
fi

BROWSER=${EDGESPEC_KIOSK_BROWSER:-}
if [ -z "$BROWSER" ]; then
  for candidate in chromium chromium-browser; do
    if command -v "$candidate" >/dev/null 2>&1; then BROWSER=$candidate; break; fi
  done
fi
if [ -z "$BROWSER" ] || ! command -v "$BROWSER" >/dev/null 2>&1; then
  config_error "Chromium not found (install it: apt install chromium, or set EDGESPEC_KIOSK_BROWSER)"
fi

GRAPHICAL=0
# In a desktop session Chromium picks X11 or Wayland itself; inside cage it must use Wayland (with
# only a hint it would fall back to cage's XWayland, which needs more memory and renders worse).
PLATFORM=--ozone-platform=wayland
if [ -n "${WAYLAND_DISPLAY:-}" ] || [ -n "${DISPLAY:-}" ]; then GRAPHICAL=1; PLATFORM=--ozone-platform-hint=auto; fi
if [ "$GRAPHICAL" = 0 ]; then
  # shellcheck disable=SC2086  # the compositor command is meant to split into words
  set -- $COMPOSITOR
  if ! command -v "$1" >/dev/null 2>&1; then
    config_error "no graphical session and no '$1' to start one (install it: apt install cage xwayland)"
  fi
  # Debian's cage (0.1.x) exits at start when it cannot launch XWayland, even for a Wayland-only client
  if [ "${1##*/}" = cage ] && ! command -v Xwayland >/dev/null 2>&1; then
    config_error "cage needs Xwayland to start (install it: apt install xwayland)"
  fi
fi

PROFILE=${EDGESPEC_KIOSK_PROFILE:-}
if [ -z "$PROFILE" ]; then
  if [ -n "${RUNTIME_DIRECTORY:-}" ]; then
    PROFILE=${RUNTIME_DIRECTORY%%:*}/profile
  elif [ -n "${XDG_RUNTIME_DIR:-}" ]; then
    PROFILE=$XDG_RUNTIME_DIR/edgespec-kiosk-profile
  else
    config_error "no place for the browser profile: set EDGESPEC_KIOSK_PROFILE (or run from the unit)"
  fi
fi

# Can this URL be fetched? curl or wget if present, else Python (edgespec's venv always has it).
probe() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsS -o /dev/null --max-time 3 "$1" 2>/dev/null
  elif command -v wget >/dev/null 2>&1; then
    wget -q -O /dev/null -T 3 "$1" 2>/dev/null
  else
    "${EDGESPEC_PYTHON:-python3}" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=3)' \
      "$1" 2>/dev/null
  fi
}

# Chromium shows its own error page, which never retries, if the page does not answer when it
# starts: so wait for the server first. (Once the page is up it handles restarts by itself.)
waited=0
until probe "$URL"; do
  if [ "$waited" = 0 ] || [ $((waited % 60)) = 0 ]; then say "waiting for $URL (is edgespec.service running?)"; fi
  if [ "$WAIT" != 0 ] && [ "$waited" -ge "$WAIT" ]; then
    say "gave up: $URL did not answer within $WAIT s"
    exit 1
  fi
  sleep 1
  waited=$((waited + 1))
done

# A fresh profile each start: no "restore pages?" prompt after a crash, nothing piles up for months.
rm -rf "$PROFILE" || config_error "cannot clear the profile folder $PROFILE"
if ! mkdir -p "$PROFILE" || ! chmod 700 "$PROFILE"; then
  config_error "cannot create the profile folder $PROFILE"
fi

# shellcheck disable=SC2086  # EDGESPEC_KIOSK_FLAGS is a list of flags
# --kiosk URL (not --kiosk --app=URL: Chromium 156 under Wayland aborts on that combination).
# The rest: no first-run UI, no prompts, nothing that phones home, no swipe-back or pinch on touch.
set -- "$BROWSER" --kiosk "$URL" \
  --user-data-dir="$PROFILE" \
  "$PLATFORM" \
  --no-first-run --no-default-browser-check \
  --noerrdialogs --disable-infobars --disable-session-crashed-bubble \
  --disable-translate --disable-features=Translate,MediaRouter,OptimizationHints \
  --disable-background-networking --disable-component-update --disable-sync --disable-quic \
  --disable-default-apps --disable-extensions --disable-breakpad \
  --check-for-update-interval=31536000 --password-store=basic \
  --overscroll-history-navigation=0 --disable-pinch \
  ${EDGESPEC_KIOSK_FLAGS:-}

say "showing $URL with $BROWSER$([ "$GRAPHICAL" = 0 ] && echo " in ${COMPOSITOR%% *}")"
if [ "$GRAPHICAL" = 1 ]; then
  exec "$@"
fi
# shellcheck disable=SC2086  # the compositor command is meant to split into words
exec $COMPOSITOR "$@"
