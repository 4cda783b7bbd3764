"""A real systemd as PID 1 in systemd-nspawn, for the service tests (tests/server/test_systemd_nspawn.py).

    python tests/systemd/nspawn.py build      # the cached rootfs and Python deps (first time ~1-2 min)
    python tests/systemd/nspawn.py shell      # boot it and get a shell inside (debugging)

What is cached under ~/.cache/edgespec-nspawn (EDGESPEC_NSPAWN_CACHE), never in the repo:
  rootfs-bookworm-v1/   `mmdebstrap --variant=minbase` Debian bookworm with systemd, dbus and python3
                        (3.11), plus the `render` group the unit's SupplementaryGroups= needs
  deps-<hash>/          `pip install --target` of edgespec's runtime + server dependencies for
                        CPython 3.11 (binary wheels only), keyed by pyproject.toml's lists

At boot the container gets, read-only: this checkout at /opt/edgespec-src, the deps at
/opt/edgespec-deps, a bundle at /srv/bundle-src. The rootfs is mounted with --volatile=overlay, so
every boot starts from the clean cached tree and nothing is written back to it. Inside, a venv at
/opt/edgespec/venv (the unit's default) sees the checkout and the deps through a .pth file: the
service runs the code under test with only the dependencies edgespec declares.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("EDGESPEC_NSPAWN_CACHE", Path.home() / ".cache" / "edgespec-nspawn"))
SUITE = "bookworm"
ROOTFS_VERSION = "v1"
GUEST_PYTHON = "3.11"  # bookworm's python3
PACKAGES = "systemd,systemd-sysv,dbus,python3,ca-certificates"


class Unavailable(Exception):
    """This machine cannot run the container (not root, tools missing); the test skips with this."""


def check_host() -> None:
    if os.geteuid() != 0:
        raise Unavailable("systemd-nspawn needs root")
    missing = [t for t in ("systemd-nspawn", "mmdebstrap", "nsenter") if shutil.which(t) is None]
    if missing:
        raise Unavailable(f"missing {', '.join(missing)} (scripts/system-deps.sh installs systemd-container, mmdebstrap)")


def _atomic_build(dest: Path, build) -> Path:
    """Builds into dest.partial-PID and renames: a half-built tree is never taken for a cached one."""
    if (dest / ".complete").exists():
        return dest
    tmp = dest.with_name(f"{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build(tmp)
        (tmp / ".complete").write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
        if (dest / ".complete").exists():  # someone else finished first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure_rootfs(log=print) -> Path:
    check_host()
    dest = CACHE / f"rootfs-{SUITE}-{ROOTFS_VERSION}"

    def build(tmp: Path) -> None:
        log(f"[nspawn] building {dest} with mmdebstrap (about a minute)")
        CACHE.mkdir(parents=True, exist_ok=True)
        cmd = ["mmdebstrap", "--variant=minbase", f"--include={PACKAGES}", "--quiet",
               # the unit's SupplementaryGroups=video render: without `render` it fails with 216/GROUP
               '--customize-hook=chroot "$1" groupadd -r render || true',
               '--customize-hook=chroot "$1" systemctl mask systemd-networkd-wait-online.service getty@tty1.service || true',
               "--customize-hook=echo edgespec-test > \"$1/etc/hostname\"",
               SUITE, str(tmp)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"mmdebstrap failed ({r.returncode}):\n{r.stderr[-3000:]}")

    return _atomic_build(dest, build)


def runtime_requirements() -> list[str]:
    """edgespec's own dependencies and its `server` and `cpu` extras, as declared in pyproject.toml (the
    runtime itself pulls no onnxruntime: a Pi's install adds the CPU one with [cpu])."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    return list(meta["dependencies"]) + list(extras["server"]) + list(extras["cpu"])


def ensure_deps(log=print) -> Path:
    reqs = runtime_requirements()
    key = hashlib.sha256("\n".join([GUEST_PYTHON, platform.machine(), *reqs]).encode()).hexdigest()[:12]
    dest = CACHE / f"deps-{key}"

    def build(tmp: Path) -> None:
        log(f"[nspawn] pip install --target {dest}: {' '.join(reqs)}")
        arch = platform.machine()
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(tmp), "--only-binary=:all:",
               "--python-version", GUEST_PYTHON, "--implementation", "cp", "--abi", "cp" + GUEST_PYTHON.replace(".", ""),
               "--platform", f"manylinux_2_28_{arch}", "--platform", f"manylinux_2_17_{arch}",
               "--platform", f"manylinux2014_{arch}", *reqs]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"pip failed ({r.returncode}):\n{r.stderr[-3000:]}")

    return _atomic_build(dest, build)


class Container:
    """One booted container; `run()` executes a command inside it (nsenter into its namespaces)."""

    def __init__(self, rootfs: Path, deps: Path, bundle: Path | None = None, log_path: Path | None = None,
                 extra_args: tuple[str, ...] = ()):
        self.rootfs, self.deps, self.bundle = rootfs, deps, bundle
        self.extra_args = tuple(extra_args)  # e.g. more --bind-ro=, or a network for a manual pip check
        self.log_path = log_path or Path(f"/tmp/edgespec-nspawn-{os.getpid()}.log")
        self.proc: subprocess.Popen | None = None
        self.leader: int | None = None

    def boot(self, timeout: float = 90) -> "Container":
        network = [] if "--network-veth" in self.extra_args or "--host-network" in self.extra_args else ["--private-network"]
        cmd = ["systemd-nspawn", "--quiet", "-D", str(self.rootfs), "--volatile=overlay", "-b", "--console=pipe",
               "--register=no", "--keep-unit", *network, f"--machine=edgespec-test-{os.getpid()}",
               f"--bind-ro={REPO}:/opt/edgespec-src", f"--bind-ro={self.deps}:/opt/edgespec-deps"]
        if self.bundle is not None:
            cmd.append(f"--bind-ro={self.bundle}:/srv/bundle-src")
        cmd += [a for a in self.extra_args if a != "--host-network"]
        self._log = open(self.log_path, "w")
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID")}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        end = time.monotonic() + timeout
        while self.leader is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.proc.returncode}:\n{self.console()}")
            if time.monotonic() > end:
                raise RuntimeError("the container's init did not appear:\n" + self.console())
            self.leader = _find_init(self.proc.pid)
            time.sleep(0.1)
        while True:  # until systemd has finished booting (running, or degraded by some unit we do not care about)
            r = self.run("systemctl", "is-system-running", check=False)
            state = r.stdout.strip()
            if state in ("running", "degraded"):
                return self
            if time.monotonic() > end:
                raise RuntimeError(f"boot did not finish (state {state!r}):\n{self.console()}")
            time.sleep(0.2)

    def run(self, *cmd: str, check: bool = True, timeout: float = 120, input: str | None = None):
        full = ["nsenter", "-t", str(self.leader), "-m", "-u", "-i", "-n", "-p", "--",
                "env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
                "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=", *cmd]
        r = subprocess.run(full, capture_output=True, text=True, timeout=timeout, input=input)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r

    def sh(self, script: str, check: bool = True, timeout: float = 120):
        return self.run("sh", "-c", script, check=check, timeout=timeout)

    def console(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def shutdown(self, timeout: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.leader is not None:  # a clean poweroff, so systemd stops the service like on a board
            subprocess.run(["kill", "-RTMIN+4", str(self.leader)], capture_output=True)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        finally:
            self._log.close()


def _find_init(nspawn_pid: int) -> int | None:
    """The container's PID 1: the descendant of systemd-nspawn whose command is systemd."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    todo = list(children.get(nspawn_pid, []))
    while todo:
        pid = todo.pop()
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = ""
        if exe.endswith("/systemd"):
            return pid
        todo.extend(children.get(pid, []))
    return None


def prepare_venv(c: Container) -> None:
    """/opt/edgespec/venv made by the guest's python3, seeing the checkout and the deps."""
    c.sh("python3 -m venv --without-pip /opt/edgespec/venv && "
         "printf '/opt/edgespec-src\\n/opt/edgespec-deps\\n' > "
         f"/opt/edgespec/venv/lib/python{GUEST_PYTHON}/site-packages/edgespec-test.pth")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "build"
    rootfs, deps = ensure_rootfs(), ensure_deps()
    print(rootfs, deps)
    if what == "shell":
        c = Container(rootfs, deps, Path(sys.argv[2]) if len(sys.argv) > 2 else None).boot()
        prepare_venv(c)
        try:
            subprocess.run(["nsenter", "-t", str(c.leader), "-m", "-u", "-i", "-n", "-p", "--", "bash", "-l"])
        finally:
            c.shutdown()
