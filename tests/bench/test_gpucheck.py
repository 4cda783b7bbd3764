"""edgespec.bench.gpucheck, the Python half of scripts/gpu-check.sh: a pytest run where every test
skipped is a failed step (exit 5), read from the JUnit XML pytest writes; a real pytest run proves the
format, hand-written reports the edges."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgespec.bench.gpucheck import JunitCounts, junit_counts, main


def run_pytest(tmp_path, body: str) -> str:
    test = tmp_path / "test_probe.py"
    test.write_text("import pytest\n" + body)
    xml = tmp_path / "probe.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test), "--junitxml", str(xml)],
                   capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return str(xml)


def test_a_real_pytest_run_where_everything_skipped_is_a_failed_step(tmp_path, capsys):
    xml = run_pytest(tmp_path, "pytestmark = pytest.mark.skip(reason='no CUDA provider')\n"
                               "def test_a(): pass\ndef test_b(): pass\n")
    assert junit_counts(xml) == JunitCounts(tests=2, skipped=2, failures=0, errors=0)
    assert main(["junit", xml]) == 5
    assert "2 tests: 0 ran, 2 skipped" in capsys.readouterr().out


def test_one_test_that_ran_and_passed_passes(tmp_path, capsys):
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite name="pytest" errors="0" failures="0" skipped="3" tests="4"/></testsuites>')
    assert main(["junit", str(xml)]) == 0
    assert "4 tests: 1 ran, 3 skipped, 0 failed, 0 errors" in capsys.readouterr().out


@pytest.mark.parametrize("attrs, why", [
    ('errors="0" failures="1" skipped="0" tests="2"', "1 failed"),
    ('errors="1" failures="0" skipped="0" tests="2"', "1 errors"),
    ('errors="0" failures="0" skipped="0" tests="0"', "every test skipped"),  # nothing collected
])
def test_failures_errors_and_empty_runs_fail(tmp_path, capsys, attrs, why):
    xml = tmp_path / "r.xml"
    xml.write_text(f'<testsuite name="pytest" {attrs}/>')  # older pytest: one <testsuite> at the root
    assert main(["junit", str(xml)]) == 5
    assert why in capsys.readouterr().out


def test_no_report_is_a_failed_step(tmp_path, capsys):
    assert main(["junit", str(tmp_path / "missing.xml")]) == 5
    assert "no readable JUnit report" in capsys.readouterr().out


def test_placement_on_the_cpu_provider_passes_and_asking_for_cuda_here_fails_with_the_reason(tiny_cuda_bundle, capsys):
    """The node-placement step reads onnxruntime's own profile: on the CPU provider every node is on
    the CPU (exit 0); asked for CUDA where onnxruntime has none, every GroupQueryAttention and
    MatMulNBits node is off CUDA: exit 1, with one line per graph saying so (the JSON goes to a file)."""
    import json

    import onnxruntime as ort

    from edgespec.bench import placement

    assert placement._main([str(tiny_cuda_bundle), "--providers", "cpu"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target:cuda"]["by_op"]["GroupQueryAttention"] == {"CPUExecutionProvider": 2}
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: the failing direction is tests/bench/test_gpu.py's")
    assert placement._main([str(tiny_cuda_bundle), "--providers", "cuda,cpu"]) == 1
    err = capsys.readouterr().err
    assert "placement: target:cuda on CPUExecutionProvider:" in err and "nodes off CUDAExecutionProvider" in err


def test_summary_reads_what_the_steps_wrote(tmp_path):
    import json

    from edgespec.bench.gpucheck import summary

    (tmp_path / "test_gpu.xml").write_text('<testsuite errors="0" failures="0" skipped="1" tests="7"/>')
    (tmp_path / "placement-smol.json").write_text(json.dumps({"target:cuda": {
        "providers": ["CUDAExecutionProvider"], "memcpy_inside_layers": ["/model/layers.3/Memcpy"],
        "key_ops_off_CUDAExecutionProvider": ["/model/layers.0/attn/GroupQueryAttention"]}}))
    (tmp_path / "plan-smol.json").write_text(json.dumps({
        "predicted_bytes": 900 << 20, "measured_peak_bytes": 1000 << 20, "error": 0.1, "device_bytes": 500 << 20,
        "unified": True, "device_measured_bytes": 450 << 20, "cuda_context_measured_bytes": 250 << 20}))
    rows = [{"mode": "target", "tokens": 100, "tokens_per_s": 50.0}, {"mode": "auto", "tokens": 100, "tokens_per_s": 100.0},
            {"mode": "target", "tokens": 300, "tokens_per_s": 50.0}, {"mode": "auto", "tokens": 300, "tokens_per_s": 60.0}]
    (tmp_path / "bench-smol-code.json").write_text(json.dumps({"summary": {"by_category": rows}}))
    lines = summary(tmp_path)
    assert lines[1] == "## Findings"
    assert "- tests/bench/test_gpu.py: 7 tests: 6 ran, 1 skipped, 0 failed, 0 errors" in lines
    assert ("- placement smol target:cuda: session on CUDAExecutionProvider; 1 GroupQueryAttention/MatMulNBits nodes "
            "off CUDAExecutionProvider, 1 Memcpy inside layers") in lines
    assert ("- plan smol: predicted 900 MiB, measured 1000 MiB (+10.0 %); device side 500 MiB in the budget, "
            "device measured 450 MiB, CUDA context measured 250 MiB") in lines
    # auto: 400 tokens in 1 + 5 = 6 s -> 66.7 tok/s against the target's 50 tok/s
    assert "- bench smol-code: target 50.0 tok/s, auto 66.7 tok/s (1.33x)" in lines
    assert summary(tmp_path / "empty") == []
