"""A bundle appears complete or not at all: full disk, Ctrl-C, a crash, a failed parity check."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers.wait import wait_for

pytest.importorskip("torch", reason="the exporter needs the export extra")

from edgespec.errors import ExportError  # noqa: E402
from edgespec.models.bundlecheck import verify_bundle  # noqa: E402
from edgespec_export import isolate, pipeline  # noqa: E402
from edgespec_export.pipeline import ExportOptions, run_export  # noqa: E402
from edgespec_export.tiny import make_tiny_model  # noqa: E402

# a child process imports this module by name, and helpers/ beside it: both folders on its path
CHILD_PATH = os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1])])


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("src") / "qwen")


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@contextmanager
def small_tmpfs(path: Path, size: str):
    """A real tiny filesystem (root can mount tmpfs); skips where mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}); the ENOSPC test below simulates it")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_too_little_disk_is_refused_up_front(tmp_path, tiny_src):
    with small_tmpfs(tmp_path / "small", "1m") as fs:
        with pytest.raises(ExportError, match=r"not enough disk space at .*: the bundle needs about .*, .* is free"):
            run_export(str(tiny_src), fs / "b", options=ExportOptions(quant="fp32", isolate=False))
        assert leftovers(fs) == []


def test_disk_filling_up_mid_export_leaves_nothing(tmp_path, tiny_src, monkeypatch):
    """The up-front estimate can be wrong (or the disk fills from elsewhere): ENOSPC while writing
    is turned into one clear error, and the partial bundle is removed."""
    monkeypatch.setattr(pipeline, "_check_disk", lambda *a: None)
    with small_tmpfs(tmp_path / "small", "400k") as fs:
        with pytest.raises(ExportError, match="disk full while writing the bundle") as e:
            run_export(str(tiny_src), fs / "b", options=ExportOptions(quant="fp32", isolate=False, parity_tokens=0))
        assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.ENOSPC
        assert leftovers(fs) == []


def test_enospc_is_reported_even_without_a_small_filesystem(tmp_path, tiny_src, monkeypatch):
    from edgespec_export import writer

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "manifest.json")

    monkeypatch.setattr(writer, "fill_file_table", full)
    with pytest.raises(ExportError, match="disk full"):
        run_export(str(tiny_src), tmp_path / "b", options=ExportOptions(quant="fp32", isolate=False, parity_tokens=0))
    assert leftovers(tmp_path) == []


class InterruptAt:
    """A Progress that raises KeyboardInterrupt (what Ctrl-C does) when a given stage starts."""

    def __init__(self, stage_prefix: str):
        self.prefix = stage_prefix
        self.seen: list[str] = []

    @contextmanager
    def stage(self, name, total, unit="it"):
        self.seen.append(name)
        if name.startswith(self.prefix):
            raise KeyboardInterrupt
        yield type("S", (), {"update": lambda self, n=1: None})()

    def note(self, m):
        pass


@pytest.mark.parametrize("stage", ["build draft", "save target", "parity draft (exported)"])
def test_ctrl_c_anywhere_leaves_no_bundle(tmp_path, tiny_src, stage):
    p = InterruptAt(stage)
    with pytest.raises(KeyboardInterrupt):
        run_export(str(tiny_src), tmp_path / "b", draft=str(tiny_src),
                   options=ExportOptions(quant="fp32", isolate=False), progress=p)
    assert p.seen[-1] == stage
    assert leftovers(tmp_path) == []


def test_ctrl_c_keeps_the_previous_bundle_when_overwriting(tmp_path, tiny_src):
    out = tmp_path / "b"
    run_export(str(tiny_src), out, options=ExportOptions(quant="fp32", isolate=False, parity_tokens=0))
    before = (out / "manifest.json").read_bytes()
    with pytest.raises(KeyboardInterrupt):
        run_export(str(tiny_src), out, options=ExportOptions(quant="int4", isolate=False, overwrite=True),
                   progress=InterruptAt("quantize target"))
    assert (out / "manifest.json").read_bytes() == before
    assert verify_bundle(out)[1] == []
    assert leftovers(tmp_path) == ["b"]


def test_parity_below_threshold_refuses_unless_forced(tmp_path, tiny_src):
    with pytest.raises(ExportError, match=r"parity check failed for the target: top-1 agreement .* is below 99%.*--force"):
        run_export(str(tiny_src), tmp_path / "b", options=ExportOptions(quant="int4", isolate=False, min_top1=0.99))
    assert leftovers(tmp_path) == []
    s = run_export(str(tiny_src), tmp_path / "b",
                   options=ExportOptions(quant="int4", isolate=False, min_top1=0.99, force=True))
    p = s.manifest.models["target"].parity
    assert p["passed"] is False and p["min_top1"] == 0.99
    assert any("written anyway" in w for w in s.manifest.extra["warnings"])
    assert verify_bundle(s.path)[1] == []


# --- the child process ---------------------------------------------------------------------------
def _child_ok(x, progress=None):
    with progress.stage("child work", total=3) as bar:
        for _ in range(3):
            bar.update(1)
    progress.note(f"got {x}")
    print("builder noise that must not reach the terminal")
    return {"double": 2 * x, "pid": os.getpid()}


def _child_fails(progress=None):
    raise ExportError("a clear reason")


def _child_dies(progress=None):
    os.kill(os.getpid(), signal.SIGKILL)


class Recorder:
    def __init__(self):
        self.events: list[tuple] = []

    @contextmanager
    def stage(self, name, total, unit="it"):
        rec = self

        class S:
            def update(self, n=1):
                rec.events.append(("update", name, n))

        self.events.append(("stage", name, total))
        yield S()

    def note(self, m):
        self.events.append(("note", m))


def test_child_result_progress_and_errors(monkeypatch, capfd):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([CHILD_PATH, os.environ.get("PYTHONPATH", "")]))
    rec = Recorder()
    stats: dict = {}
    out = isolate.call(_child_ok, 21, progress=rec, what="test", stats=stats)
    assert out == {"double": 42, "pid": out["pid"]} and out["pid"] != os.getpid() and stats["peak_rss"] > 10e6
    assert ("stage", "child work", 3) in rec.events and ("note", "got 21") in rec.events
    assert sum(e[2] for e in rec.events if e[0] == "update") == 3
    assert "builder noise" not in capfd.readouterr().out
    with pytest.raises(ExportError, match="a clear reason"):
        isolate.call(_child_fails, progress=rec, what="test")
    with pytest.raises(ExportError, match=r"test died with exit code -9 \(killed: out of memory\?\)"):
        isolate.call(_child_dies, progress=rec, what="test")


# Installed as sitecustomize in the export's processes: their first model job holds (marking that it
# has started, or with EDGESPEC_TEST_HOLD_AFTER that it has written its files) until a signal ends it,
# so the test's signal never races a tiny export that finishes first (measured: a fresh-clone CI run
# saw `edgespec export` exit 0 before its SIGINT arrived).
HOLD_JOB = """import os, time
if os.environ.get("EDGESPEC_TEST_HOLD"):
    import edgespec_export.job as _job
    _run = _job.run_model_job

    def run_model_job(job, progress=None):
        if os.environ.get("EDGESPEC_TEST_HOLD_AFTER"):
            _run(job, progress)
        open(os.environ["EDGESPEC_TEST_HOLD"], "w").close()
        time.sleep(600)

    _job.run_model_job = run_model_job
"""


def _held_export(tmp_path: Path, tiny_src: Path, hold: Path, *, after: bool = False) -> subprocess.Popen:
    """`edgespec export` of tiny_src into tmp_path/b, returned once its model child is running and held
    (`after`: once its first model job has written its files); the hook and its marker in `hold`,
    outside the folder whose leftovers the test checks."""
    site = hold / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HOLD_JOB)
    marker = hold / "held"
    paths = [str(site)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, EDGESPEC_TEST_HOLD=str(marker), PYTHONPATH=os.pathsep.join(paths))
    if after:
        env["EDGESPEC_TEST_HOLD_AFTER"] = "1"
    # SIGINT at its default, as in a terminal: a test run started in the background (`cmd &`) passes
    # SIGINT down ignored, and Python then installs no Ctrl-C handler (measured: the export ran on)
    proc = subprocess.Popen([sys.executable, "-m", "edgespec", "export", str(tiny_src), "-o", str(tmp_path / "b"),
                             "--quant", "fp32"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_for("the export's model job to start and hold", marker.exists, timeout=120)
    return proc


@pytest.mark.slow
def test_sigint_to_the_cli_stops_child_and_leaves_nothing(tmp_path, tiny_src, tmp_path_factory):
    """Ctrl-C as a user presses it: SIGINT to the `edgespec export` process while a model child runs."""
    proc = _held_export(tmp_path, tiny_src, tmp_path_factory.mktemp("hold"))
    children = _children(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    assert leftovers(tmp_path) == []
    wait_for("the model children to exit", lambda: all(not _alive(pid) for pid in children))


def test_sigterm_unwinds_the_export_like_ctrl_c(tmp_path, tiny_src, monkeypatch):
    """SIGTERM mid-export raises where the export stands, the partial folder is removed, and then the
    signal goes on to the handler that was there before (here a recorder; by default: death by SIGTERM)."""
    from edgespec_export import writer

    def sigterm_now(*a):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(pipeline, "_check_disk", sigterm_now)  # the first step after <out>.partial exists
    seen = []

    def recorder(sig, frame):
        seen.append(sig)

    previous = signal.signal(signal.SIGTERM, recorder)
    try:
        with pytest.raises(writer.Terminated):
            run_export(str(tiny_src), tmp_path / "b", options=ExportOptions(quant="fp32", isolate=False))
        assert seen == [signal.SIGTERM]
        assert leftovers(tmp_path) == []
        assert signal.getsignal(signal.SIGTERM) is recorder  # put back
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.slow
def test_sigterm_to_the_cli_stops_child_and_leaves_nothing(tmp_path, tiny_src, tmp_path_factory):
    """`systemctl stop`, `kill`, a CI timeout: SIGTERM to `edgespec export` while a model child runs
    cleans up as Ctrl-C does, then the process dies of SIGTERM. It used to leave `<out>.partial`."""
    proc = _held_export(tmp_path, tiny_src, tmp_path_factory.mktemp("hold"))
    children = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM
    assert leftovers(tmp_path) == []
    wait_for("the model children to exit", lambda: all(not _alive(pid) for pid in children))


@pytest.mark.slow
def test_sigkill_leaves_only_a_partial_folder_that_verify_refuses(tmp_path, tiny_src, tmp_path_factory):
    """SIGKILL (no cleanup can run) once the target's graphs are written: held there, so the kill never
    races a tiny export that finishes first (polling for the folder and then killing did)."""
    out = tmp_path / "b"
    proc = _held_export(tmp_path, tiny_src, tmp_path_factory.mktemp("hold"), after=True)
    assert (tmp_path / "b.partial" / "target").is_dir()
    children = _children(proc.pid)
    proc.kill()
    proc.wait()
    # the model child dies with its parent
    wait_for("the model children to exit", lambda: all(not _alive(pid) for pid in children))
    assert not out.exists()
    manifest, problems = verify_bundle(tmp_path / "b.partial")
    assert manifest is None and "unfinished export" in problems[0]
    # the next export cleans the leftover and succeeds
    r = subprocess.run([sys.executable, "-m", "edgespec", "export", str(tiny_src), "-o", str(out), "--quant", "fp32",
                        "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert leftovers(tmp_path) == ["b"]


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_sigterm_during_the_cleanup_waits_for_it(tmp_path, monkeypatch):
    """A service manager signals the export and its model child together: the child's death may be
    the failure being cleaned up when the export's own SIGTERM arrives. It must not cut that cleanup
    short: it is raised once the partial folder is gone."""
    from edgespec_export import writer

    tmp = writer.start(tmp_path / "b", overwrite=False)
    (tmp / "target").mkdir()
    (tmp / "target" / "model.onnx").write_bytes(b"x" * 1000)
    real_rmtree = writer.shutil.rmtree

    def rmtree_interrupted(path, **kw):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-cleanup
        real_rmtree(path, **kw)

    monkeypatch.setattr(writer.shutil, "rmtree", rmtree_interrupted)
    seen = []

    def recorder(sig, frame):
        seen.append(sig)

    previous = signal.signal(signal.SIGTERM, recorder)
    try:
        with pytest.raises(writer.Terminated):
            with writer.sigterm_cleans_up():
                try:
                    raise ExportError("model export died with exit code -15")
                except ExportError:
                    writer.remove_partial(tmp)
                    raise
        assert leftovers(tmp_path) == [] and seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
