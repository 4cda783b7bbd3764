"""The systemd notification protocol (sd_notify) in a few lines, so the service needs no libsystemd binding.

systemd passes a unix datagram socket in $NOTIFY_SOCKET; each datagram is newline-separated
`KEY=VALUE` assignments (READY=1, WATCHDOG=1, STOPPING=1, STATUS=...). A name starting with '@' is
in the abstract namespace. Outside systemd (no $NOTIFY_SOCKET) every call is a silent no-op, so the
server runs unchanged from a terminal. A failing send never takes the server down: the worst case is
that systemd restarts it, which is what the watchdog is for anyway.
"""
from __future__ import annotations

import logging
import os
import socket
import threading

log = logging.getLogger(__name__)


class Notifier:
    """One connectionless socket, reused for every message (the watchdog pings every few seconds)."""

    def __init__(self, address: str | None = None, environ: dict[str, str] | None = None):
        env = os.environ if environ is None else environ
        self.address = env.get("NOTIFY_SOCKET") if address is None else address
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._warned = False
        self.watchdog_usec = watchdog_usec(env)
        self.watchdog_sent = 0

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def _target(self) -> str | bytes:
        addr = self.address or ""
        if addr.startswith("@"):
            return b"\0" + addr[1:].encode()
        return addr

    def send(self, **fields: object) -> bool:
        """`send(READY=1, STATUS="serving")` -> b"READY=1\\nSTATUS=serving". Returns whether it was sent."""
        if not self.enabled:
            return False
        lines = []
        for key, value in fields.items():
            text = str(value)
            if "\n" in text:  # one assignment per line: a newline would smuggle in another key
                text = text.replace("\n", " ")
            lines.append(f"{key}={text}")
        payload = "\n".join(lines).encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(payload, self._target())
                return True
            except OSError as e:
                if not self._warned:  # once: a dead socket would otherwise log at every ping
                    log.warning("sd_notify to %s failed: %s", self.address, e)
                    self._warned = True
                return False

    # the messages the service sends, named for when it sends them
    def ready(self, status: str = "serving") -> bool:
        return self.send(READY=1, STATUS=status)

    def status(self, text: str) -> bool:
        return self.send(STATUS=text)

    def watchdog(self) -> bool:
        sent = self.send(WATCHDOG=1)
        self.watchdog_sent += int(sent)  # the test hook that hangs the loop reports it (service.py)
        return sent

    def stopping(self, status: str = "draining") -> bool:
        return self.send(STOPPING=1, STATUS=status)

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def watchdog_usec(environ: dict[str, str] | None = None) -> int | None:
    """The watchdog period systemd asked for, or None when there is none for this process.

    $WATCHDOG_PID, when set, names the process the watchdog is meant for: a child that inherited the
    environment must not ping on the parent's behalf.
    """
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value if value > 0 else None


def ping_interval(usec: int | None) -> float | None:
    """Ping at a third of the period: two pings can be late before systemd gives up on us."""
    return None if usec is None else max(usec / 3 / 1_000_000, 0.05)
