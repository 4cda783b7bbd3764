"""A killed export leaves no `edgespec-export-*` folder in /tmp: the pipeline keeps its child job
folders under `<out>.partial/.work` (removed by the next export of that bundle), and any caller's
leftover whose owner process is gone is removed by the next isolated call."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the exporter needs the export extra")

from edgespec_export import isolate, pipeline  # noqa: E402
from edgespec_export.pipeline import ExportOptions, run_export  # noqa: E402
from helpers.wait import wait_for  # noqa: E402
from edgespec_export.tiny import make_tiny_model  # noqa: E402

# a child process imports this module by name, and helpers/ beside it: both folders on its path
CHILD_PATH = os.pathsep.join([str(Path(__file__).parent), str(Path(__file__).parents[1])])


class Quiet:
    def stage(self, name, total, unit="it"):
        import contextlib

        @contextlib.contextmanager
        def cm():
            class S:
                def update(self, n=1):
                    pass
            yield S()
        return cm()

    def note(self, m):
        pass


def _child_job_path(progress=None):
    return sys.argv[1]  # the child's JOB argument: where its job folder is


def test_job_folder_goes_where_it_is_told(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([CHILD_PATH, os.environ.get("PYTHONPATH", "")]))
    job = Path(isolate.call(_child_job_path, progress=Quiet(), what="test", log_dir=tmp_path))
    assert job.parent.parent == tmp_path and job.parent.name.startswith(isolate.PREFIX)
    assert not job.parent.exists()  # removed when the call ends


def test_the_pipeline_keeps_job_folders_inside_the_partial_folder(tmp_path, monkeypatch):
    src = make_tiny_model(tmp_path / "src" / "qwen")
    seen = []
    real = isolate.call

    def spy(fn, *args, log_dir=None, **kw):
        seen.append(log_dir)
        kw["isolate"] = False  # in-process: the test is about where, not how
        return real(fn, *args, log_dir=log_dir, **kw)

    monkeypatch.setattr(pipeline.isolate, "call", spy)
    out = tmp_path / "b"
    run_export(str(src), out, options=ExportOptions(quant="fp32", parity_tokens=0), progress=Quiet())
    assert seen and all(d is not None and d.parent == tmp_path / "b.partial" for d in seen), seen


def test_a_killed_callers_leftover_is_removed_by_the_next_call(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # a parent that starts an isolated call and is killed mid-way, as SIGKILL or a power cut would
    script = (
        "import sys, time, tempfile; tempfile.tempdir = sys.argv[1]\n"
        "from edgespec_export import isolate\n"
        "import test_export_tempdirs as t\n"
        "isolate.call(t._child_sleeps, progress=t.Quiet(), what='victim')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([CHILD_PATH, os.environ.get("PYTHONPATH", "")]))
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], env=env)
    def child_started():
        assert parent.poll() is None, "the victim exited before starting its child"
        return list(tmp_path.glob(isolate.PREFIX + "*/child.log"))

    wait_for("the victim's child to start", child_started, timeout=60)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    (left,) = tmp_path.glob(isolate.PREFIX + "*")
    assert (left / "job.pkl").exists()  # what the probe found in /tmp
    other = tmp_path / (isolate.PREFIX + "not-ours")
    other.mkdir()  # no owner file (an older version's, or another tool's): left alone
    assert isolate.clean_stale() == [left]
    assert not left.exists() and other.exists()


def _child_sleeps(progress=None):
    import time

    time.sleep(120)
