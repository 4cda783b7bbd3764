"""`edgespec tune BUNDLE --gguf X.gguf` (and `edgespec export X.gguf --tune`): keep the target form this
machine runs fastest, within a quality budget.

Which form of a GGUF's target decodes fastest depends on the CPU: a 1-token step reads every weight
once, so on a machine where the int8 kernel keeps up with memory the fewest bytes win, and where the
kernel's work per block weighs (a Zen 4: blocks of 128 at 0.6x the time of blocks of 32) larger blocks
win even at equal bytes. So the candidates are built from the GGUF beside the bundle and timed here:

| candidate | what changes against the bundle's default form |
|---|---|
| default | nothing: Q4_K kept exactly (blocks of 32, its minimums as integers), Q6_K at 8 bits, blocks of 128 |
| q4-block64 | the 4-bit bodies rounded from the GGUF's dequantized values to 4 bits, blocks of 64, uint8 zero points |
| q4-block128 | the same in blocks of 128 (float32 scales: 0.25 bits a weight instead of 1 at block 32) |
| q6k-4bit | the Q6_K parts (v, down, a Q6_K lm_head) at 4 bits, blocks of 128, zero points |
| acc1 | the default form with MatMulNBits accuracy_level 1 (float32 compute; rewritten in place, no export) |

Each is scored against the GGUF's own numpy forward pass on the export's parity text (parity.py,
native/reference.py): mean KL and top-1 agreement; and timed through the runtime's ModelRunner
(engine/build.py load_runner, the CPU provider, one thread per core): the median 1-token and 4-token
step after a short context, over `seconds` each. The fastest 1-token step within the budget is kept;
the default form is kept when none is within it. The choice, the table and the machine are recorded in
manifest.extra["tuned"] (the runtime's verify and doctor read it: edgespec/edge/tuned.py).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from edgespec.errors import ExportError

# The quality budget, against the GGUF the user chose (not against the float model): the default form sits at
# 0.0011 mean KL and 98.4 % top-1 from it on the parity text (the 1.5B target; int8 activations alone). 0.01
# nats and 97 % top-1 (3 greedy choices in 100 differ, against the default form's 1.6) keep a candidate within a
# few times the default form's own distance, so a reader gets the model they chose; a form that needs more to be
# fast is not kept. The exact form stays one flag away (export without --tune).
BUDGET_KL = 0.01
BUDGET_TOP1 = 0.97
TIMING_S = 30.0  # seconds of 1-token steps, and again of 4-token steps, per candidate
CONTEXT = 64  # tokens in the cache before the timed steps (the positions a short prompt leaves)
MULTI = 4  # the multi-token step timed: a verify of 3 drafted tokens


@dataclass(frozen=True)
class Candidate:
    name: str
    body_block: int = 0  # 4-bit bodies rounded in blocks of this with zero points (0: the GGUF's own)
    q6k_bits: int = 8
    accuracy_level: int = 4

    @property
    def exported(self) -> bool:
        """Needs its own export (its weights differ from the bundle's)."""
        return bool(self.body_block) or self.q6k_bits != 8


CANDIDATES = (Candidate("default"), Candidate("q4-block64", body_block=64), Candidate("q4-block128", body_block=128),
              Candidate("q6k-4bit", q6k_bits=4), Candidate("acc1", accuracy_level=1))


@dataclass
class Row:
    form: str
    bytes_per_token: int
    mean_kl: float
    top1: float
    ms1: float
    ms4: float
    chosen: bool = False


# time_step(model_path, facts, seconds) -> (1-token ms, MULTI-token ms): the seam tests replace
TimeStep = Callable[[Path, object, float], "tuple[float, float]"]


def time_steps(model_path: Path, facts, seconds: float) -> tuple[float, float]:
    """Median ms of a 1-token and a MULTI-token step after CONTEXT tokens, each repeated for `seconds`
    (at least 3 times), the cache rewound after each: the runtime's runner and session options."""
    from edgespec.edge.providers import CPU
    from edgespec.engine.build import load_runner

    runner = load_runner(model_path, facts, max_len=CONTEXT + MULTI + 1, providers=[CPU],
                         threads=len(os.sched_getaffinity(0)))
    tokens = [(17 * i + 100) % min(1000, facts.vocab_size) for i in range(CONTEXT + MULTI)]  # any real ids
    runner.step(tokens[:CONTEXT], n_logits=1)
    out = []
    for n in (1, MULTI):
        runner.step(tokens[CONTEXT:CONTEXT + n], n_logits=n)  # a warm-up step
        runner.rewind(CONTEXT)
        times, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end or len(times) < 3:
            t0 = time.perf_counter()
            runner.step(tokens[CONTEXT:CONTEXT + n], n_logits=n)
            times.append(time.perf_counter() - t0)
            runner.rewind(CONTEXT)
        out.append(1000 * statistics.median(times))
    return out[0], out[1]


def _read_manifest(bundle: Path):
    from edgespec.models.manifest import MANIFEST_NAME, Manifest

    path = bundle / MANIFEST_NAME
    if not path.is_file():
        raise ExportError(f"{bundle}: not a bundle (no {MANIFEST_NAME}); export one first: edgespec export X.gguf -o DIR")
    try:
        return Manifest.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as e:
        raise ExportError(f"{path}: cannot read the manifest ({type(e).__name__}: {e})") from None


def find_gguf(bundle: Path, manifest, gguf: Path | None) -> Path:
    """The target's GGUF: the one named, else the file the manifest names beside the bundle, else at
    the path it was exported from. A bundle not exported from a GGUF is refused."""
    src = manifest.extra.get("sources", {}).get("target", {})
    if src.get("kind") != "gguf":
        raise ExportError(f"{bundle}: its target was not exported from a GGUF (source: {src.get('spec', 'unknown')}): "
                          "tune rebuilds the candidate forms from one; export from a .gguf file first")
    if gguf is not None:
        if not Path(gguf).is_file():
            raise ExportError(f"--gguf {gguf}: no such file")
        return Path(gguf)
    name = manifest.models["target"].source
    tried = [bundle.parent / Path(name).name, Path(src.get("spec", name)).expanduser()]
    for p in tried:
        if p.is_file():
            return p
    raise ExportError(f"{bundle}: its GGUF is not beside it nor at {tried[1]}: pass it with --gguf X.gguf")


def _with_accuracy(src_dir: Path, dst_dir: Path, facts, level: int):
    """A copy of a target folder whose MatMulNBits run at `level` (the weights hard-linked, the graph
    rewritten: an attribute), and its facts. The minimum terms stay at level 1 (graph.py)."""
    import onnx

    dst_dir.mkdir(parents=True)
    for f in src_dir.iterdir():
        if f.name != Path(facts.path).name:
            try:
                os.link(f, dst_dir / f.name)
            except OSError:
                shutil.copy2(f, dst_dir / f.name)
    model = onnx.load(str(src_dir / Path(facts.path).name), load_external_data=False)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and not node.name.endswith("Minimum_Q4"):
            for a in node.attribute:
                if a.name == "accuracy_level":
                    a.i = level
    onnx.save(model, str(dst_dir / Path(facts.path).name))
    return replace(facts, accuracy_level=level)


def _export_form(gguf: Path, out: Path, c: Candidate, progress, isolate: bool):
    from .pipeline import ExportOptions, run_export

    summary = run_export(str(gguf), out, options=ExportOptions(
        gguf_body_block=c.body_block, gguf_q6k_bits=c.q6k_bits, parity_tokens=0, name=out.name, isolate=isolate),
        progress=progress)
    m = summary.manifest
    return m.models["target"], m.extra["quant_map"]["target"]


def tune(bundle: Path, gguf: Path | None = None, *, budget_kl: float = BUDGET_KL, min_top1: float = BUDGET_TOP1,
         candidates=None, seconds: float = TIMING_S, time_step: TimeStep | None = None,
         progress=None, out=None, isolate: bool = True) -> list[Row]:
    """Builds, scores and times `candidates`, rewrites `bundle` in the chosen form with manifest.extra
    ["tuned"], and returns the table (printed to `out` as it fills)."""
    from .parity import compare, exported_logprobs, parity_ids
    from .progress import NullProgress

    progress = progress or NullProgress()
    time_step = time_step or time_steps
    candidates = candidates or CANDIDATES
    if not budget_kl > 0:
        raise ExportError(f"--budget-kl {budget_kl}: must be above 0 (mean KL in nats; default {BUDGET_KL})")
    if not 0 < min_top1 <= 1:
        raise ExportError(f"--budget-top1 {min_top1}: must be in (0, 1] (default {BUDGET_TOP1})")
    if not seconds > 0:
        raise ExportError(f"--seconds {seconds}: must be above 0")
    bundle = Path(bundle).expanduser()
    manifest = _read_manifest(bundle)
    gguf = find_gguf(bundle, manifest, gguf)
    base = manifest.models["target"]
    if len(base.graphs()) > 1 or base.flavor != "cpu":
        raise ExportError(f"{bundle}: tune times the cpu flavor alone; this target has {'+'.join(base.graphs())}")
    from .native.gguf_model import GGUFModel
    from .native.reference import reference_logprobs

    usable = manifest.tokenizer.usable_vocab
    ids = parity_ids(bundle / "tokenizer.json", (base.parity or {}).get("tokens") or 256)
    gg = GGUFModel(gguf, "target source")
    with progress.stage("tune: gguf reference", total=gg.config.layers + 1, unit="layer") as bar:
        ref = reference_logprobs(gg, ids, usable, bar)
    del gg
    work = bundle.parent / f".{bundle.name}.tune"
    shutil.rmtree(work, ignore_errors=True)
    from . import writer

    with writer.sigterm_cleans_up():  # SIGTERM unwinds like Ctrl-C: no work folder left behind
        work.mkdir()
        try:
            rows, forms = [], {}
            base_bytes = manifest.extra.get("quant_map", {}).get("target", {}).get("weight_bytes_per_token", 0)
            # a bundle tuned before into another form holds that form: every candidate is then built afresh
            rebuilt = manifest.extra.get("tuned", {}).get("chosen", "default") != "default"
            for c in candidates:
                if c.exported or rebuilt:
                    facts, qmap = _export_form(gguf, work / c.name, c, progress, isolate)
                    tdir = work / c.name / "target"
                else:
                    facts, qmap, tdir = base, manifest.extra.get("quant_map", {}).get("target"), bundle / "target"
                if c.accuracy_level != facts.accuracy_level:
                    facts = _with_accuracy(tdir, work / f"{c.name}.acc", facts, c.accuracy_level)
                    tdir = work / f"{c.name}.acc"
                path = tdir / Path(facts.path).name
                got, _ = exported_logprobs(path, facts, ids, usable, progress, role=f"tune {c.name}")
                score = compare(ref, got)
                ms1, ms4 = time_step(path, facts, seconds)
                rows.append(Row(c.name, int((qmap or {}).get("weight_bytes_per_token", base_bytes)), score["mean_kl"],
                                score["top1"], round(ms1, 2), round(ms4, 2)))
                forms[c.name] = (c, facts, qmap, tdir, score)
                if out is not None:
                    print(format_row(rows[-1]), file=out, flush=True)
            chosen = choose(rows, budget_kl, min_top1)
            chosen.chosen = True
            if out is not None:
                within = chosen.mean_kl <= budget_kl and chosen.top1 >= min_top1
                print(f"kept {chosen.form}: " + ("the fastest 1-token step" if within else "no form is") +
                      f" within mean KL <= {budget_kl} and top-1 >= {min_top1:.0%}", file=out, flush=True)
            _write(bundle, manifest, forms[chosen.form], rows, dict(mean_kl=budget_kl, top1=min_top1), seconds)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return rows


def choose(rows: list[Row], budget_kl: float, min_top1: float) -> Row:
    """The fastest 1-token step within the budget; the first row (the default form) when none is."""
    within = [r for r in rows if r.mean_kl <= budget_kl and r.top1 >= min_top1]
    return min(within, key=lambda r: r.ms1) if within else rows[0]


def tuned_record(rows: list[Row], budget: dict, seconds: float) -> dict:
    import onnxruntime as ort

    from edgespec.edge.tuned import machine

    return {"machine": machine(), "onnxruntime": ort.__version__,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "threads": len(os.sched_getaffinity(0)), "seconds_per_step_kind": seconds, "budget": budget,
            "chosen": next(r.form for r in rows if r.chosen), "table": [asdict(r) for r in rows]}


def _write(bundle: Path, manifest, form, rows: list[Row], budget: dict, seconds: float) -> None:
    """The bundle in the chosen form (its target folder swapped, the rest hard-linked), the manifest
    rewritten with the record; renamed into place as `export` does (writer.finish)."""
    from . import writer

    c, facts, qmap, tdir, score = form
    tmp = bundle.parent / f".{bundle.name}.tuned.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for f in bundle.rglob("*"):
        rel = f.relative_to(bundle)
        if not f.is_file() or rel.parts[0] == "target" or rel.name == "manifest.json" or rel.name.startswith("."):
            continue
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        os.link(f, tmp / rel)
    for f in tdir.iterdir():
        (tmp / "target").mkdir(exist_ok=True)
        os.link(f, tmp / "target" / f.name)
    old = manifest.models["target"]
    parity = dict(old.parity or {}, **score)
    parity["passed"] = score["top1"] >= parity.get("min_top1", 0)
    manifest.models["target"] = replace(facts, path=old.path, source=old.source, parity=parity,
                                        self_draft=old.self_draft, vocab_map=old.vocab_map)
    if qmap:
        manifest.extra.setdefault("quant_map", {})["target"] = qmap
    manifest.extra["tuned"] = tuned_record(rows, budget, seconds)
    manifest.files = {}
    try:
        writer.finish(manifest, tmp, bundle)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def format_row(r: Row) -> str:
    return (f"  {r.form:<12} {r.bytes_per_token / 1e6:>9,.1f} MB  {r.mean_kl:>8.5f}  {r.top1:>6.1%}  "
            f"{r.ms1:>8.1f}  {r.ms4:>8.1f}  {'chosen' if r.chosen else ''}")


HEADER = "  form         bytes/token   mean KL   top-1  1-tok ms  4-tok ms"



def register(sub) -> None:
    """`edgespec tune`, registered beside `edgespec export` (command.py: the same entry point)."""
    p = sub.add_parser(
        "tune", help="rewrite a bundle's target in the form this machine runs fastest, within a quality budget",
        description="Build the candidate forms of a bundle's target from its GGUF, score each against the GGUF's "
        "own logits (mean KL, top-1) and time its 1-token and 4-token steps here; keep the fastest within the "
        "budget (docs/export.md, \"Tuning on the device\"). Minutes per candidate.")
    p.add_argument("bundle", metavar="BUNDLE_DIR", help="a bundle exported from a .gguf file")
    p.add_argument("--gguf", metavar="FILE", help="the target's GGUF (default: the file the manifest names, beside "
                   "the bundle or where it was exported from)")
    p.add_argument("--budget-kl", type=float, default=BUDGET_KL, metavar="NATS",
                   help=f"the most mean KL against the GGUF a kept form may have (default {BUDGET_KL})")
    p.add_argument("--budget-top1", type=float, default=BUDGET_TOP1, metavar="F",
                   help=f"the least top-1 agreement with the GGUF a kept form may have (default {BUDGET_TOP1})")
    p.add_argument("--seconds", type=float, default=TIMING_S, metavar="S",
                   help=f"seconds each step size is timed per candidate (default {TIMING_S:.0f})")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args) -> int:
    import sys

    from .progress import TqdmProgress

    print(HEADER)
    tune(Path(args.bundle), Path(args.gguf) if args.gguf else None, budget_kl=args.budget_kl,
         min_top1=args.budget_top1, seconds=args.seconds, progress=TqdmProgress(enabled=not args.quiet), out=sys.stdout)
    return 0
