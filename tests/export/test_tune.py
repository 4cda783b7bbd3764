"""`edgespec tune`: the candidate forms scored against the GGUF and timed through a seam (fake step times, so
nothing here depends on this machine's speed); the choice, the record, and the runtime's "tuned elsewhere" line."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("onnxruntime")

from edgespec.edge import tuned as tuned_mod  # noqa: E402
from edgespec.errors import ExportError  # noqa: E402
from edgespec.models.bundlecheck import verify_bundle  # noqa: E402
from edgespec_export.native.blocks import round_min_max  # noqa: E402
from edgespec_export.native.tiny_gguf import Q4_K_M, make_gguf  # noqa: E402
from edgespec_export.pipeline import ExportOptions, run_export  # noqa: E402
from edgespec_export.tune import Candidate, Row, choose, tune  # noqa: E402

HERE = {"cpu": "Test CPU 9000", "flags": ["avx2"], "cores": 2}
DEFAULT, ACC1, B128 = Candidate("default"), Candidate("acc1", accuracy_level=1), Candidate("q4-block128", body_block=128)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune")
    gguf = make_gguf(d / "m.gguf", types=Q4_K_M, seed=4)
    run_export(str(gguf), d / "b", options=ExportOptions(isolate=False, parity_tokens=96, force=True))
    return d


@pytest.fixture
def bundle(built, tmp_path, monkeypatch):
    """A fresh copy of the tiny Q4_K_M bundle with its GGUF beside it; this machine is HERE."""
    shutil.copy(built / "m.gguf", tmp_path / "m.gguf")
    shutil.copytree(built / "b", tmp_path / "b")
    monkeypatch.setattr(tuned_mod, "machine", lambda root="/": dict(HERE))
    return tmp_path / "b"


def timer(ms: dict):
    """A time_step seam: (1-token, 4-token) ms by the graph's accuracy level and block size."""
    def step(path, facts, seconds):
        return ms[(facts.accuracy_level, facts.block_size)], 2 * ms[(facts.accuracy_level, facts.block_size)]
    return step


def run_tune(bundle, candidates, ms, **kw):
    return tune(bundle, candidates=candidates, seconds=0.01, time_step=timer(ms), isolate=False, **kw)


def manifest(bundle) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


def test_an_over_budget_form_is_never_chosen_even_when_fastest(bundle):
    # on random tiny weights the int8 activations of level 4 cost ~0.07 mean KL; level 1 stays near 0
    rows = run_tune(bundle, (DEFAULT, ACC1), {(4, 32): 1.0, (1, 32): 5.0}, budget_kl=0.01, min_top1=0.9)
    by = {r.form: r for r in rows}
    assert by["default"].mean_kl > 0.01 and by["acc1"].mean_kl <= 0.01
    assert [r.form for r in rows if r.chosen] == ["acc1"] and by["default"].ms1 < by["acc1"].ms1
    m, problems = verify_bundle(bundle)
    assert problems == [] and m.models["target"].accuracy_level == 1
    import onnx

    g = onnx.load(str(bundle / "target" / "model.onnx"), load_external_data=False).graph
    levels = {a.i for n in g.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"}
    assert levels == {1}
    t = m.extra["tuned"]
    assert t["machine"] == HERE and t["chosen"] == "acc1" and t["budget"] == {"mean_kl": 0.01, "top1": 0.9}
    assert [r["form"] for r in t["table"]] == ["default", "acc1"] and t["onnxruntime"]
    assert m.models["target"].parity["mean_kl"] == by["acc1"].mean_kl


@pytest.mark.parametrize("fast", ["default", "q4-block128"])
def test_the_fastest_form_within_the_budget_is_kept(bundle, fast):
    ms = {(4, 32): 1.0, (4, 128): 3.0} if fast == "default" else {(4, 32): 3.0, (4, 128): 1.0}
    rows = run_tune(bundle, (DEFAULT, B128), ms, budget_kl=50.0, min_top1=0.01)  # both within
    assert [r.form for r in rows if r.chosen] == [fast]
    m, problems = verify_bundle(bundle)
    assert problems == []
    forms = m.extra["quant_map"]["target"]["tensors"]
    rounded = [k for k in forms if "re-quantized to 4-bit, block 128, zero points" in k]
    assert bool(rounded) == (fast == "q4-block128"), forms
    b128 = next(r for r in rows if r.form == "q4-block128")
    assert b128.bytes_per_token < next(r for r in rows if r.form == "default").bytes_per_token


def test_choose_falls_back_to_the_default_form_when_none_is_within():
    rows = [Row("default", 10, 0.5, 0.8, 9.0, 20.0), Row("fast", 5, 0.6, 0.7, 1.0, 2.0)]
    assert choose(rows, 0.01, 0.97).form == "default"


def test_verify_says_when_the_bundle_was_tuned_on_another_cpu(bundle, monkeypatch, capsys):
    from edgespec.cli.main import main

    run_tune(bundle, (DEFAULT,), {(4, 32): 1.0}, budget_kl=50.0, min_top1=0.01)
    assert main(["verify", str(bundle), "--fast"]) == 0
    assert "tuned on another kind of CPU" not in capsys.readouterr().out
    monkeypatch.setattr(tuned_mod, "machine", lambda root="/": {"cpu": "Other CPU", "flags": ["avx2", "avx512f"],
                                                                "cores": 8})
    assert main(["verify", str(bundle), "--fast"]) == 0
    note = [ln for ln in capsys.readouterr().out.splitlines() if "tuned on another kind of CPU" in ln]
    assert len(note) == 1 and "Test CPU 9000 (avx2)" in note[0] and "Other CPU (avx2 avx512f)" in note[0]
    assert "edgespec tune BUNDLE --gguf" in note[0] and tuned_mod.bundle_note(bundle) in note[0]
    main(["doctor", "--bundle", str(bundle), "--no-probe"])
    assert [ln for ln in capsys.readouterr().out.splitlines() if "tuned on another kind of CPU" in ln] == [
        f"{'bundle':<12} {tuned_mod.bundle_note(bundle)}"]


def test_flags_alone_make_another_kind_and_cores_do_not():
    extra = {"tuned": {"machine": HERE, "chosen": "default"}}
    assert tuned_mod.tuned_elsewhere(extra, dict(HERE, cores=16)) is None
    assert "avx_vnni" in tuned_mod.tuned_elsewhere(extra, dict(HERE, flags=["avx2", "avx_vnni"]))
    assert tuned_mod.tuned_elsewhere({}, HERE) is None  # never tuned: nothing to say


def test_machine_reads_the_kernel_flags(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text("processor : 0\nmodel name : X\nflags : fpu sse avx2 avx512f avx512_vnni\n"
                                               "processor : 1\nmodel name : X\n")
    assert tuned_mod.machine(tmp_path) == {"cpu": "X", "flags": ["avx2", "avx512_vnni", "avx512f"], "cores": 2}


def test_a_missing_gguf_is_one_line(bundle, tmp_path):
    with pytest.raises(ExportError, match=r"^--gguf .*nope\.gguf: no such file$"):
        tune(bundle, tmp_path / "nope.gguf", time_step=timer({}))
    (tmp_path / "m.gguf").rename(tmp_path / "moved.gguf")  # neither beside the bundle nor where it was exported from
    m = manifest(bundle)
    m["extra"]["sources"]["target"]["spec"] = str(tmp_path / "gone" / "m.gguf")
    (bundle / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ExportError, match=r"its GGUF is not beside it nor at .*: pass it with --gguf X\.gguf$"):
        tune(bundle, time_step=timer({}))


def test_a_bundle_not_exported_from_a_gguf_is_refused(bundle):
    m = manifest(bundle)
    m["extra"]["sources"]["target"] = {"kind": "hf", "spec": "/models/qwen", "params": 1}
    (bundle / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ExportError, match=r"its target was not exported from a GGUF \(source: /models/qwen\)"):
        tune(bundle, time_step=timer({}))


@pytest.mark.parametrize("kw,msg", [({"budget_kl": 0.0}, r"--budget-kl 0\.0: must be above 0"),
                                    ({"budget_kl": -1.0}, r"--budget-kl -1\.0: must be above 0"),
                                    ({"min_top1": 1.5}, r"--budget-top1 1\.5: must be in \(0, 1\]"),
                                    ({"seconds": 0}, r"--seconds 0: must be above 0")])
def test_a_bad_budget_is_one_line(bundle, kw, msg):
    before = manifest(bundle)
    with pytest.raises(ExportError, match=msg):
        tune(bundle, time_step=timer({}), **kw)
    assert manifest(bundle) == before  # nothing touched


def test_not_a_bundle_and_export_tune_of_a_folder_are_one_line(tmp_path, capsys):
    from edgespec.cli.main import main

    with pytest.raises(ExportError, match=r"not a bundle \(no manifest\.json\)"):
        tune(tmp_path, time_step=timer({}))
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "out"), "--tune"]) != 0
    assert "--tune: the target must be a .gguf file" in capsys.readouterr().err


def test_min_max_rounding_is_within_half_a_step():
    w = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32) + 0.5  # one-sided blocks too
    e = round_min_max(w, 4, 128)
    step = np.repeat(e.scales, 128, axis=1)
    assert np.all(np.abs(e.dequantize() - w) <= step / 2 + 1e-6)
    assert e.zero_points.dtype == np.uint8 and e.zero_points.shape == (8, 2)


def test_the_commands_print_the_table_and_record_the_choice(built, tmp_path, monkeypatch, capsys):
    """`edgespec export X.gguf --tune` and `edgespec tune BUNDLE --gguf X.gguf`, their timer and candidates replaced."""
    import edgespec_export.tune as tune_mod
    from edgespec.cli.main import main

    monkeypatch.setattr(tuned_mod, "machine", lambda root="/": dict(HERE))
    monkeypatch.setattr(tune_mod, "CANDIDATES", (DEFAULT, ACC1))
    monkeypatch.setattr(tune_mod, "time_steps", timer({(4, 32): 1.0, (1, 32): 4.0}))
    assert main(["export", str(built / "m.gguf"), "-o", str(tmp_path / "e"), "--tune", "-q", "--in-process",
                 "--force", "--parity-tokens", "96"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("bytes/token"):].splitlines()[1:]
    assert [ln.split()[0] for ln in table] == ["default", "acc1", "kept"]
    # random tiny weights: both forms are over the default budget, so the default form is kept
    assert table[2] == "kept default: no form is within mean KL <= 0.01 and top-1 >= 97%"
    assert manifest(tmp_path / "e")["extra"]["tuned"]["chosen"] == "default"
    shutil.copy(built / "m.gguf", tmp_path / "elsewhere.gguf")
    assert main(["tune", str(tmp_path / "e"), "--gguf", str(tmp_path / "elsewhere.gguf"), "-q", "--budget-kl", "0.01",
                 "--budget-top1", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "kept acc1: the fastest 1-token step within mean KL <= 0.01 and top-1 >= 90%" in out  # the only one within
    assert manifest(tmp_path / "e")["models"]["target"]["accuracy_level"] == 1
    # tuned again: the bundle now holds acc1, so the default form is rebuilt from the GGUF, not read from it
    monkeypatch.setattr(tune_mod, "time_steps", timer({(4, 32): 1.0, (1, 32): 4.0}))
    rows = tune(tmp_path / "e", tmp_path / "elsewhere.gguf", budget_kl=50.0, min_top1=0.01, isolate=False)
    assert [r.form for r in rows if r.chosen] == ["default"] and rows[0].mean_kl > 0.01  # level 4's int8 KL again
    assert manifest(tmp_path / "e")["models"]["target"]["accuracy_level"] == 4


def test_an_interrupted_tune_leaves_the_bundle_as_it_was_and_no_work_folder(bundle):
    before = manifest(bundle)

    def interrupted(path, facts, seconds):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tune(bundle, candidates=(DEFAULT, ACC1), seconds=0.01, time_step=interrupted, isolate=False)
    assert manifest(bundle) == before and verify_bundle(bundle)[1] == []
    assert sorted(p.name for p in bundle.parent.iterdir()) == ["b", "m.gguf"]
