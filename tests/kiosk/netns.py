"""A network namespace with nothing but loopback, for proving the kiosk works with no network.

Run as a script (under `unshare --net`) it is the namespace's keeper: it brings `lo` up, prints
"ready" and waits until its stdin closes, so the namespace disappears with the test even if the test
process is killed. Servers and the browser join it with `nsenter --net=/proc/<keeper>/ns/net`; the
test process itself stays outside and drives the browser over Playwright's pipe, not the network.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def bring_loopback_up() -> None:
    """`ip link set lo up` without needing iproute2: a fresh namespace starts with lo down."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def why_unavailable() -> str | None:
    """None when an offline namespace can be made here, else the reason it cannot."""
    for tool in ("unshare", "nsenter"):
        if not shutil.which(tool):
            return f"`{tool}` not found (util-linux)"
    if os.geteuid() != 0:
        return "making a network namespace needs root (CI runs this test as root)"
    return None


# What a process inside sees: its interfaces, and what happens when it tries to reach the world.
_PROBE = r"""
import json, socket
out = {"interfaces": sorted(name for _, name in socket.if_nameindex())}
try:
    socket.create_connection(("1.1.1.1", 443), timeout=3).close()
    out["outside"] = "reachable"
except OSError as e:
    out["outside"] = f"unreachable: {e}"
print(json.dumps(out))
"""


class OfflineNamespace:
    def __init__(self) -> None:
        self.keeper: subprocess.Popen | None = None

    def start(self) -> "OfflineNamespace":
        self.keeper = subprocess.Popen(
            ["unshare", "--net", "--", sys.executable, str(Path(__file__).resolve())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        line = self.keeper.stdout.readline().strip()
        if line != "ready":
            err = self.keeper.stderr.read() if self.keeper.poll() is not None else ""
            self.close()
            raise RuntimeError(f"could not make an offline network namespace: {line!r} {err.strip()}")
        return self

    @property
    def pid(self) -> int:
        assert self.keeper is not None
        return self.keeper.pid

    def prefix(self) -> list[str]:
        """Prepend to a command to run it inside the namespace."""
        return ["nsenter", f"--net=/proc/{self.pid}/ns/net", "--"]

    def popen(self, cmd: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.prefix() + cmd, **kw)

    def run(self, cmd: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.prefix() + cmd, **kw)

    def probe(self) -> dict:
        import json

        r = self.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def http_ok(self, url: str, timeout: float = 2.0) -> bool:
        """A GET from inside the namespace (the test process itself cannot reach in)."""
        code = (f"import urllib.request,sys\ntry:\n urllib.request.urlopen({url!r}, timeout={timeout})\n"
                f"except Exception:\n sys.exit(1)")
        return self.run([sys.executable, "-c", code], capture_output=True, timeout=timeout + 30).returncode == 0

    def wrapper(self, program: str, folder: Path) -> Path:
        """A script that runs `program` inside the namespace: Playwright launches it as the browser."""
        path = folder / f"in-netns-{Path(program).name}"
        path.write_text(f'#!/bin/sh\nexec {" ".join(self.prefix())} "{program}" "$@"\n')
        path.chmod(0o755)
        return path

    def close(self) -> None:
        if self.keeper is None:
            return
        try:
            self.keeper.stdin.close()
            self.keeper.wait(timeout=5)
        except (subprocess.TimeoutExpired, OSError):
            self.keeper.kill()
            self.keeper.wait()
        self.keeper = None


if __name__ == "__main__":
    bring_loopback_up()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or dies)
