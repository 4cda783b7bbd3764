"""`edgespec export`: sources -> tokenizer check -> one job per model -> bundle, in that order.

Everything cheap that can refuse an export (a missing source, an unsupported architecture, a tokenizer
mismatch, an existing output folder, too little disk) runs before anything expensive. Each model is
then exported in its own child process (isolate.py), and the bundle is written to `<out>.partial/` and
renamed into place only when complete (writer.py): a crash, Ctrl-C, SIGTERM or a full disk leaves nothing
that `verify` or the runtime would accept (Ctrl-C and SIGTERM: nothing at all).
"""
from __future__ import annotations

import errno
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgespec.errors import ExportError
from edgespec.limits import QUANTS
from edgespec.models.bundlecheck import verify_bundle
from edgespec.models.manifest import Manifest, ModelFacts, TokenizerFacts

from . import isolate, writer
from .contract import FLAVORS, graph_flavor
from .heads import HEADS_DIR, HeadsJob, HeadsOptions, check_options, train_heads
from .job import ModelJob, run_model_job
from .native import parity_length, via_for
from .native.plan import DEFAULT_MINIMUM, DEFAULT_Q6K_BLOCK
from .parity import DEFAULT_MIN_TOP1
from .quantize import DEFAULT_ACCURACY_LEVEL, draft_quant, draft_vocab
from edgespec.units import format_bytes

from .progress import MemoryMonitor, NullProgress, Progress
from .sources import Source, resolve
from .tokcheck import check_tokenizers
from .tokenizer_files import TOKENIZER_FILES, TokenizerInfo, write_tokenizers

VIAS = ("auto", "native", "torch")
WORK = ".work"  # scratch folder inside <out>.partial/, removed before the manifest is written
BYTES_PER_PARAM = {"int4": 0.6, "int8": 1.1, "fp16": 2.0, "fp32": 4.0}  # bundle bytes per parameter, generous


@dataclass
class ExportOptions:
    quant: str = "int4"
    draft_quant: str | None = None  # default: quantize.draft_quant (int4 under an int4 export, else quant)
    block_size: int | None = None  # None: per model, quantize.default_block_size
    accuracy_level: int = DEFAULT_ACCURACY_LEVEL
    head_bits: int | None = None  # lm_head (+ tied embedding) bits; default 8 (quantize.DEFAULT_HEAD_BITS)
    overwrite: bool = False
    name: str | None = None
    max_context: int = 4096  # the runtime's default cache length (capped by the models' own limit)
    min_top1: float | None = None  # default: DEFAULT_MIN_TOP1[quant]
    draft_min_top1: float | None = None  # default: min_top1, else DEFAULT_MIN_TOP1[draft quant]
    force: bool = False  # write the bundle even if parity is below the threshold
    parity_tokens: int | None = None  # 0 skips parity (writer tests); None: native.parity_length's default
    isolate: bool = True  # each model in its own child process (frees memory between models)
    # graph flavors to write, first one = each role's model.onnx (docs/export.md, "Flavors"):
    # ("cpu",) float32; ("cuda",) float16 for the CUDA provider; ("cpu", "cuda") both in one bundle
    eps: tuple[str, ...] = ("cpu",)
    draft_vocab: int | None = None  # the draft lm_head's rows kept (prune_vocab.py; 0: all; None: quantize.draft_vocab)
    # search the layers `draft="self"` skips (self_search.py: minutes on a CPU for a 1.5B target); without
    # it the bundle has no self-draft record and the runtime refuses draft="self" naming this option
    self_draft: bool = False
    # draft heads trained at export (heads.py): None = none, else HeadsOptions (method "medusa", sizes)
    heads: HeadsOptions | None = None
    # how a model is built: "auto" (a .gguf natively, anything else with the torch builder), "native"
    # (GGUF only, no torch: native/), "torch" (transformers + onnxruntime-genai's builder)
    via: str = "auto"
    keep_gguf_quant: bool = True  # native: keep the GGUF's own blocks where they map (no --quant given)
    gguf_minimum: str = DEFAULT_MINIMUM  # native: minimums exact as integers / a float offset, or rounded (native/plan.py)
    gguf_q6k_block: int = DEFAULT_Q6K_BLOCK  # native: Q6_K rounded to 8 bits in blocks of this, 0 keeps them (native/plan.py)
    gguf_body_block: int = 0  # native, set by the tuner (tune.py): 4-bit bodies rounded in blocks of this (0: kept)
    gguf_q6k_bits: int = 8  # native, set by the tuner: Q6_K rounded to 8 or 4 bits


@dataclass
class ExportSummary:
    path: Path
    manifest: Manifest
    bytes_by_role: dict[str, int]
    total_bytes: int
    seconds: float
    peak_rss_tree: int
    peak_rss_single: int
    warnings: list[str] = field(default_factory=list)


def validate_options(o: ExportOptions) -> None:
    for label, q in (("--quant", o.quant), ("--draft-quant", o.draft_quant)):
        if q is not None and q not in QUANTS:
            raise ExportError(f"{label} {q!r} is not one of {', '.join(QUANTS)}")
    if o.block_size is not None and (o.block_size < 16 or o.block_size & (o.block_size - 1)):
        raise ExportError(f"--block-size {o.block_size}: must be a power of two, 16 or more (e.g. 32, the "
                          "default, or 128)")
    if o.accuracy_level not in (0, 1, 2, 3, 4):
        raise ExportError(f"--accuracy-level {o.accuracy_level}: must be 0-4 (1 fp32, 2 fp16, 3 bf16, 4 int8)")
    if o.head_bits not in (None, 4, 8):
        raise ExportError(f"--head-bits {o.head_bits}: must be 4 or 8")
    if o.max_context < 16:
        raise ExportError(f"--max-context {o.max_context}: too small")
    if isinstance(o.eps, str):
        o.eps = tuple(e.strip() for e in o.eps.split(",") if e.strip())
    if not o.eps:
        raise ExportError("--ep: name at least one flavor: cpu, cuda or cpu,cuda")
    for ep in o.eps:
        if ep not in FLAVORS:
            raise ExportError(f"--ep {ep!r}: flavors are {', '.join(FLAVORS)} (e.g. --ep cuda, or --ep cpu,cuda for both)")
    for label, q in (("--quant", o.quant), ("--draft-quant", o.draft_quant)):
        for ep in o.eps:
            try:
                graph_flavor(q or o.quant, ep)
            except ValueError as e:
                raise ExportError(f"{label} {q or o.quant} with --ep {ep}: {e}") from None
    if o.via not in VIAS:
        raise ExportError(f"--via {o.via!r}: one of {', '.join(VIAS)}")
    from .native.plan import MINIMUMS

    if o.gguf_minimum not in MINIMUMS:
        raise ExportError(f"--gguf-minimum {o.gguf_minimum!r}: integer or offset (exact), or zero-point")
    if o.gguf_q6k_block and (o.gguf_q6k_block < 16 or o.gguf_q6k_block & (o.gguf_q6k_block - 1)):
        raise ExportError(f"--gguf-q6k-block {o.gguf_q6k_block}: a power of two of at least 16 (MatMulNBits' "
                          "blocks), or 0 to keep Q6_K's own blocks")
    if o.draft_vocab is not None and (type(o.draft_vocab) is not int or o.draft_vocab < 0):
        raise ExportError(f"--draft-vocab {o.draft_vocab!r}: must be a whole number of tokens (0 = keep all)")
    if isinstance(o.heads, str):
        o.heads = HeadsOptions(method=o.heads)
    if o.heads is not None and (why := check_options(o.heads)):
        raise ExportError(why)
    for label, v in (("--min-top1", o.min_top1), ("--draft-min-top1", o.draft_min_top1)):
        if v is not None and not 0.0 <= v <= 1.0:
            raise ExportError(f"{label} {v}: must be between 0 and 1")


def export_bundle(target, out, *, draft=None, progress: Progress | None = None, **options) -> Path:
    """Builds a bundle at `out` from `target` (and `draft`): each a Hugging Face folder, a .gguf file or a
    hub id. Options: see ExportOptions. Returns the bundle's path."""
    return run_export(str(target), Path(out), draft=None if draft is None else str(draft),
                      options=ExportOptions(**options), progress=progress).path


def run_export(
    target: str, out: Path, *, draft: str | None = None, options: ExportOptions | None = None,
    progress: Progress | None = None,
) -> ExportSummary:
    with writer.sigterm_cleans_up():  # SIGTERM leaves nothing behind, as Ctrl-C does
        return _run_export(target, out, draft, options or ExportOptions(), progress or NullProgress())


def _run_export(target: str, out: Path, draft: str | None, o: ExportOptions, progress: Progress) -> ExportSummary:
    validate_options(o)
    out = Path(out).expanduser()
    t_start = time.perf_counter()
    warnings: list[str] = []

    def warn(msg: str) -> None:
        warnings.append(msg)
        progress.note(msg)

    sources = {"target": resolve(target, "target", progress=progress)}
    if draft is not None:
        sources["draft"] = resolve(draft, "draft", progress=progress)
        if sources["draft"].params > sources["target"].params:
            warn(
                f"the draft ({sources['draft'].params / 1e9:.2f} B parameters) is larger than the target "
                f"({sources['target'].params / 1e9:.2f} B): drafting with it will be slower than the target alone"
            )
    _refuse_output_inside_source(out, sources)
    vias = {role: via_for(src, o.via) for role, src in sources.items()}
    quants = {"target": o.quant, "draft": draft_quant(o.quant, o.draft_quant)}

    with MemoryMonitor() as mem:
        tmp = writer.start(out, overwrite=o.overwrite)
        try:
            _check_disk(out, sources, quants, len(o.eps))
            work = tmp / WORK
            work.mkdir()
            manifest, results = _export_into(tmp, work, out, sources, quants, o, progress, warn, vias)
            shutil.rmtree(work)
            manifest.extra["warnings"] = list(warnings)
            manifest.extra["exporter"]["seconds"] = round(time.perf_counter() - t_start, 1)
            largest = max([mem.peak_single] + [r.get("peak_rss", 0) for r in results.values()])
            manifest.extra["exporter"]["peak_rss_bytes"] = {
                # all export processes together (sampled every 0.2 s; never below the exact largest one)
                "process_tree": max(mem.peak_tree, largest),
                "largest_process": largest,  # exact: the kernel's high-water mark of each process
            }
            writer.finish(manifest, tmp, out)
        except OSError as e:
            writer.remove_partial(tmp)
            if e.errno == errno.ENOSPC:
                raise ExportError(
                    f"disk full while writing the bundle next to {out} ({e.filename or 'a bundle file'}): "
                    "nothing was left behind; free some space or choose another -o"
                ) from e
            raise
        except BaseException:
            writer.remove_partial(tmp)
            raise
    manifest, problems = verify_bundle(out)
    if problems or manifest is None:  # pragma: no cover - would be a bug in the writer
        raise ExportError(f"the bundle written to {out} does not verify: {'; '.join(problems)}")
    sizes = {role: sum(e["size"] for rel, e in manifest.files.items() if rel.startswith(role + "/")) for role in manifest.models}
    single = manifest.extra["exporter"]["peak_rss_bytes"]["largest_process"]
    return ExportSummary(
        path=out, manifest=manifest, bytes_by_role=sizes, total_bytes=sum(e["size"] for e in manifest.files.values()),
        seconds=time.perf_counter() - t_start, peak_rss_tree=max(mem.peak_tree, single),
        peak_rss_single=single, warnings=warnings,
    )


def _export_into(tmp: Path, work: Path, out: Path, sources: dict[str, Source], quants: dict[str, str],
                 o: ExportOptions, progress: Progress, warn, vias: dict[str, str]) -> tuple[Manifest, dict[str, dict]]:
    # tokenizers first: a mismatch is refused before minutes of loading
    dests = {role: tmp if role == "target" else work / f"{role}-tokenizer" for role in sources}
    tok_paths = {role: d / "tokenizer.json" for role, d in dests.items()}
    gguf = any(src.kind == "gguf" for src in sources.values())  # converting one is heavy: isolate it
    infos: dict[str, TokenizerInfo] = isolate.call(
        write_tokenizers, {role: (src, dests[role]) for role, src in sources.items()}, progress=progress,
        isolate=o.isolate and gguf, what="tokenizers", log_dir=work)
    for role, info in infos.items():
        for n in info.notes:
            progress.note(f"{role} tokenizer: {n}")
    check = check_tokenizers(tok_paths, {role: src.vocab_rows for role, src in sources.items()})
    for w in check.warnings:
        warn(w)
    if "draft" in sources and infos["draft"].eos_ids != infos["target"].eos_ids:
        warn(f"draft and target declare different end tokens ({infos['draft'].eos_ids} vs {infos['target'].eos_ids}); the target's are used")

    max_ctx = min(src.max_context for src in sources.values())
    ids: list[int] = []
    n_parity = parity_length(o.parity_tokens, vias)
    if n_parity:
        from .parity import parity_ids

        ids = parity_ids(tok_paths["target"], min(n_parity, max_ctx - 1))
        ids = [i for i in ids if i < check.usable_vocab]

    models: dict[str, ModelFacts] = {}
    results: dict[str, dict] = {}
    for role, src in sources.items():
        flavors = list(dict.fromkeys(graph_flavor(quants[role], ep) for ep in o.eps))  # fp16: always cuda
        for n, flavor in enumerate(flavors):
            job = ModelJob(role=role, source=src, out_dir=tmp / role, work_dir=work, quant=quants[role],
                           block_size=o.block_size, accuracy_level=o.accuracy_level, parity_ids=ids,
                           usable_vocab=check.usable_vocab, head_bits=o.head_bits, ep=flavor, primary=n == 0,
                           via=vias[role], gguf_minimum=o.gguf_minimum, gguf_q6k_block=o.gguf_q6k_block,
                           keep_gguf_quant=o.keep_gguf_quant and role == "target",  # the draft: its own form
                           gguf_body_block=o.gguf_body_block if role == "target" else 0,
                           gguf_q6k_bits=o.gguf_q6k_bits if role == "target" else 8)
            stats: dict = {}
            what = f"{role} export" + (f" ({flavor} flavor)" if len(o.eps) > 1 or flavor != "cpu" else "")
            # the child's job folder lives in <out>.partial/.work: a killed export leaves nothing in /tmp
            res = isolate.call(run_model_job, job, progress=progress, isolate=o.isolate, what=what, stats=stats,
                               log_dir=work)
            res["peak_rss"] = stats.get("peak_rss", 0)
            facts = ModelFacts(**res["facts"])
            threshold = _threshold(role, quants[role], o)
            if res["parity"]:  # measured per flavor: float16 kernels round differently
                passed = res["parity"]["top1"] >= threshold
                res["parity"].update(min_top1=threshold, passed=passed)
                if not passed:
                    which = f"the {role}" + (f" ({flavor} flavor)" if len(flavors) > 1 or flavor != "cpu" else "")
                    msg = (f"parity check failed for {which}: top-1 agreement "
                           f"{res['parity']['top1']:.1%} is below {threshold:.0%} (mean KL {res['parity']['mean_kl']:.4f})")
                    if not o.force:
                        raise ExportError(msg + "; pass --force to write the bundle anyway, or --min-top1 to change the threshold")
                    warn(msg + " (written anyway: --force)")
            facts.parity = res["parity"]
            if n == 0:
                models[role] = facts
                results[role] = res
            else:
                models[role].flavors[flavor] = {
                    "path": facts.path, "kv_dtype": facts.kv_dtype, "activation_dtype": facts.activation_dtype,
                    "logits_dtype": facts.logits_dtype, "parity": facts.parity}
                results[role]["peak_rss"] = max(results[role]["peak_rss"], res["peak_rss"])
                results[role]["timings"] = {**results[role]["timings"],
                                            **{f"{flavor}_{k}": v for k, v in res["timings"].items()}}

    if o.self_draft:
        _choose_self_draft(tmp, models["target"], ids, check.usable_vocab, progress, warn)

    tok = infos["target"]
    pruned = None
    if (n_vocab := draft_vocab(o.draft_vocab, o.quant, check.usable_vocab, len(o.eps))) and "draft" in models:
        pruned = _prune_draft_vocab(tmp, models["draft"], n_vocab, check.usable_vocab, tok_paths["target"], ids,
                                    [*tok.eos_ids, *tok.special_tokens.values(), *([tok.bos_id] if tok.bos_id is not None else [])],
                                    progress)
    elif o.draft_vocab:
        warn("--draft-vocab is ignored: the bundle has no draft model")
    tokenizer = TokenizerFacts(
        files=list(TOKENIZER_FILES), usable_vocab=check.usable_vocab, bos_id=tok.bos_id, eos_ids=tok.eos_ids,
        pad_id=tok.pad_id, add_bos=tok.add_bos, chat_template=tok.chat_template, special_tokens=tok.special_tokens,
    )
    heads = None
    if o.heads is not None:
        heads = _train_heads(tmp, work, models["target"], tokenizer, tok_paths["target"], o, progress, results)
    drafting = recommend_drafting(models, results)
    if pruned is not None:
        drafting["draft_vocab"] = pruned
    manifest = Manifest(
        name=o.name or out.name,
        models=models,
        tokenizer=tokenizer,
        files={},
        drafting=drafting,
        defaults={"max_len": min(o.max_context, max_ctx)},
        heads=heads,
        extra={
            "exporter": _versions(),
            "options": {"quant": o.quant, "draft_quant": quants.get("draft"), "block_size": o.block_size,
                        "accuracy_level": o.accuracy_level, "head_bits": o.head_bits, "force": o.force,
                        "ep": list(o.eps), "via": o.via, "keep_gguf_quant": o.keep_gguf_quant},
            "sources": {role: {"kind": s.kind, "spec": s.spec, "params": s.params} for role, s in sources.items()},
            "timings_s": {role: r["timings"] for role, r in results.items()},
            "exporters": dict(vias),
            "quant_map": {role: r["quant_map"] for role, r in results.items() if r.get("quant_map")},
            "peak_rss_bytes_by_model": {role: r["peak_rss"] for role, r in results.items()},
            "peak_rss_bytes_after_step": {role: r.get("peak_rss_after", {}) for role, r in results.items()},
            "tokenizer_check": check.as_dict(),
            "tokenizer_notes": {role: i.notes for role, i in infos.items() if i.notes},
            "warnings": [],
        },
    )
    return manifest, results


def _choose_self_draft(tmp: Path, facts: ModelFacts, ids: list[int], usable: int, progress: Progress, warn) -> None:
    """`export --self-draft` chooses the layers `draft="self"` skips (self_search.py) and records the
    choice in the manifest; a graph the layer edit does not understand gets no record (the runtime's
    default would fail on it the same way, with the reason)."""
    from edgespec.drafters.self import default_skip
    from edgespec.models.layer_skip import LayerSkipError

    from .self_search import max_evaluations, search_skip

    if facts.layers < 2:
        return
    if not ids:  # no calibration text (--parity-tokens 0): the documented default, recorded as such
        facts.self_draft = {"skip": default_skip(facts.layers), "method": "default (no calibration text)"}
        return
    cpu = facts.graphs().get("cpu")
    if cpu is None:  # the self-draft runs on the CPU provider's graph only (docs/runtime.md)
        facts.self_draft = {"skip": default_skip(facts.layers), "method": "default (no cpu-flavor graph)"}
        return
    with progress.stage("self-draft search", total=max_evaluations(facts.layers), unit="set") as bar:
        try:
            facts.self_draft = search_skip(tmp / cpu.path, cpu, ids, usable, progress=bar)
        except LayerSkipError as e:
            warn(f"no self-draft for this target: {e}")


def _prune_draft_vocab(tmp: Path, facts: ModelFacts, n: int, usable: int, tokenizer_json: Path, parity_ids: list[int],
                       always: list[int], progress: Progress) -> dict[str, Any]:
    """Keeps the draft lm_head's rows for n frequent tokens (prune_vocab.py) and writes the row -> id
    map next to the draft; facts are updated in place. Returns what the manifest records."""
    import numpy as np
    from tokenizers import Tokenizer

    from .prune_vocab import CORPUS, VOCAB_MAP, choose_kept, prune_head, shipped_prompt_text

    if n >= usable:
        raise ExportError(f"--draft-vocab {n}: must be below the usable vocabulary ({usable}); 0 keeps every row")
    if facts.flavors:
        raise ExportError("--draft-vocab with more than one graph flavor (--ep cpu,cuda) is not supported yet: "
                          "export one flavor per bundle")
    tk = Tokenizer.from_file(str(tokenizer_json))
    corpus = list(parity_ids)
    for text in shipped_prompt_text():
        corpus += tk.encode(text, add_special_tokens=False).ids
    kept = choose_kept(n, usable, corpus_ids=corpus, always=always)
    progress.note(f"draft vocabulary: keeping {n} of {usable} lm_head rows")
    prune_head(tmp / facts.path, kept, facts.logits)
    rel = f"{Path(facts.path).parent.as_posix()}/{VOCAB_MAP}"
    np.save(tmp / rel, kept.astype(np.int32))
    facts.vocab_size = int(kept.size)
    facts.vocab_map = rel
    return {"kept": int(kept.size), "of": usable, "map": rel, "corpus": CORPUS, "corpus_tokens": len(corpus)}


def _train_heads(tmp: Path, work: Path, target: ModelFacts, tokenizer: TokenizerFacts, tokenizer_json: Path,
                 o: ExportOptions, progress: Progress, results: dict) -> dict[str, Any]:
    """Trains draft heads on the exported target (heads.py), in a child process like a model job.
    Returns the manifest's heads record; its peak memory joins the exporter's."""
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(tokenizer_json))
    text = lambda i: (tk.id_to_token(i) or "") if i is not None else ""  # noqa: E731
    always = [*tokenizer.eos_ids, *tokenizer.special_tokens.values(), *([tokenizer.bos_id] if tokenizer.bos_id is not None else [])]
    job = HeadsJob(target_path=tmp / target.path, facts=asdict(target), tokenizer_json=tokenizer_json,
                   chat_template=tokenizer.chat_template,
                   bos_eos_text=(text(tokenizer.bos_id), text(tokenizer.eos_ids[0] if tokenizer.eos_ids else None)),
                   usable=tokenizer.usable_vocab, eos_ids=list(tokenizer.eos_ids), always=always,
                   out_dir=tmp / HEADS_DIR, options=o.heads)
    stats: dict = {}
    record = isolate.call(train_heads, job, progress=progress, isolate=o.isolate, what="heads training", stats=stats,
                          log_dir=work)
    results["heads"] = {"peak_rss": stats.get("peak_rss", 0), "timings": {
        k: record["training"][k] for k in ("data_seconds", "train_seconds")}}
    return record


def _threshold(role: str, quant: str, o: ExportOptions) -> float:
    if role == "draft" and o.draft_min_top1 is not None:
        return o.draft_min_top1
    if o.min_top1 is not None:
        return o.min_top1
    return DEFAULT_MIN_TOP1[quant]


def recommend_drafting(models: dict[str, ModelFacts], results: dict[str, dict]) -> dict[str, Any]:
    """Settings the runtime starts from (it re-measures as it runs). With a draft: the k that maximises
    tokens per unit of cost, using the draft's greedy agreement with the target on the parity text as
    the acceptance rate a, and a step cost proportional to parameters (bandwidth-bound devices):
    E[tokens/round] = (1 - a^(k+1)) / (1 - a); cost = k * c_draft + (1 + 0.15 k) for the verify."""
    if "draft" not in models:
        return {"mode": "auto", "k": 4, "max_k": 8}
    ta, da = results["target"].get("argmax"), results["draft"].get("argmax")
    if not ta or not da:
        return {"mode": "auto", "k": 4, "max_k": 8}
    a = sum(x == y for x, y in zip(ta, da)) / len(ta)
    c = models["draft"].params / max(1, models["target"].params)
    best_k, best = 1, 0.0
    for k in range(1, 9):
        tokens = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1
        rate = tokens / (k * c + 1 + 0.15 * k)
        if rate > best:
            best_k, best = k, rate
    return {"mode": "auto", "k": best_k, "max_k": 8, "draft_agreement": round(a, 4),
            "draft_cost_ratio": round(c, 4), "expected_speedup": round(best, 3)}


def _versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for pkg in ("edgespec", "onnxruntime", "onnxruntime-genai", "onnx", "onnx-ir", "transformers", "torch", "gguf"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def _refuse_output_inside_source(out: Path, sources: dict[str, Source]) -> None:
    o = out.resolve()
    for role, src in sources.items():
        folder = src.path if src.path.is_dir() else src.path.parent
        if src.kind != "gguf" and (o == folder.resolve() or folder.resolve() in o.parents):
            raise ExportError(f"-o {out} is inside the {role} source folder {folder}: choose another output")


def _check_disk(out: Path, sources: dict[str, Source], quants: dict[str, str], graphs: int = 1) -> None:
    need = graphs * sum(src.params * BYTES_PER_PARAM[quants[role]] for role, src in sources.items()) + 50e6
    free = shutil.disk_usage(out.parent).free
    if free < need:
        raise ExportError(
            f"not enough disk space at {out.parent}: the bundle needs about {format_bytes(need)}, "
            f"{format_bytes(free)} is free"
        )
