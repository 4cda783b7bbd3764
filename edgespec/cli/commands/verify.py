"""`edgespec verify BUNDLE`: is this bundle exactly what the exporter wrote?

Runs exactly the checks Bundle.open runs (models.bundle.read_bundle: schema with every field typed
and range-checked, manifest digest, every file inside the bundle with its size and sha256, no stray
files, the manifest's facts against the graphs themselves - input names, layer count, kv heads,
head_dim, dtypes, weights files - every node against its provider's kernel contract, the cpu table
for a cpu graph and the cuda table for a cuda one (models/kernels.py, naming the node and the rule),
tokenizer/model compatibility, tokenizer.json parsed, the chat template compiled and rendered under a
budget) and prints one line per problem; exit 0 when there are none (1 otherwise; `serve` exits 78 on
the same problems).
`--load` also opens each graph with onnxruntime and runs one step, for a bundle that verifies but was
built for a different runtime.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("verify", help="check a bundle's manifest, checksums and compatibility",
                       description="Check a bundle: manifest schema and digest, every file's size and sha256, "
                       "no unlisted files, the manifest's facts against the graphs, every node against its provider's "
                       "kernel contract, target/draft compatibility. One line per problem; exit 0 if none.")
    p.add_argument("bundle", metavar="BUNDLE", help="bundle folder (or its manifest.json), or the name of one under "
                   "$EDGESPEC_HOME/bundles")
    p.add_argument("--fast", action="store_true", help="check sizes only, not sha256 (seconds instead of minutes on a Pi)")
    p.add_argument("--load", action="store_true", help="also load each model with onnxruntime and run one step")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.set_defaults(func=run)


def check(path: Path, *, checksums: bool = True, load: bool = False) -> tuple[object, list[str]]:
    """(manifest or None, problems): exactly Bundle.open's checks (models.bundle.read_bundle), plus
    the optional load test."""
    from ...models.bundle import not_found_message, read_bundle, resolve_bundle
    from ...models.manifest import MANIFEST_NAME

    given, path = path, resolve_bundle(path)
    if path.is_file() and path.name == MANIFEST_NAME:
        path = path.parent
    if not path.exists():
        return None, [not_found_message(given)]
    reading = read_bundle(path, checksums=checksums)
    manifest, problems = reading.manifest, reading.problems + reading.mismatches
    if load and manifest is not None and not problems:
        problems += load_problems(path, manifest)
    return manifest, problems


def load_problems(root: Path, manifest) -> list[str]:
    """Opens every graph (each flavor) and runs a 2-token step; a failure is one line naming it.
    A graph of another flavor than this machine's provider is opened anyway (force_flavor): it is
    checked, not served."""
    import numpy as np

    from ...engine.build import load_runner
    from ...models.graphcheck import dtype_problems, io_types_session

    problems = []
    from dataclasses import replace

    for facts in [replace(g, flavors={}) for m in manifest.models.values() for g in m.graphs().values()]:
        try:
            runner = load_runner(root / facts.path, facts, max_len=8, force_flavor=True)
            problems += dtype_problems(facts, io_types_session(runner.session))
            out = runner.step([0, 1], n_logits=2)
            if out.shape != (2, facts.vocab_size) or not np.isfinite(out).all():
                problems.append(f"{facts.path}: one step gave logits of shape {out.shape}, finite={np.isfinite(out).all()}")
        except Exception as e:  # onnxruntime raises many types; each is one line here
            problems.append(f"{facts.path}: onnxruntime cannot run it: {type(e).__name__}: {str(e).splitlines()[0]}")
    return problems


def run(args: argparse.Namespace) -> int:
    from ...units import format_bytes

    from ...models.bundle import resolve_bundle

    path = resolve_bundle(args.bundle)
    manifest, problems = check(Path(args.bundle), checksums=not args.fast, load=args.load)
    if args.json:
        print(json.dumps({"bundle": str(path), "ok": not problems, "problems": problems,
                          "checksums": not args.fast, "loaded": bool(args.load and not problems)}, indent=2))
        return 0 if not problems else 1
    if not path.exists():  # the one line says what was looked for and how to make it
        print(problems[0], file=sys.stdout)
        return 1
    if problems:
        for p in problems:
            print(f"{path}: {p}", file=sys.stdout)
        print(f"{path}: NOT OK ({len(problems)} problem(s))", file=sys.stdout)
        return 1
    files = manifest.files
    size = sum(e["size"] for e in files.values())
    how = "sizes checked (--fast)" if args.fast else "sha256 checked"
    models = ", ".join(f"{role} {f.arch} {f.quant} ({'+'.join(f.graphs())}: "
                       f"{'/'.join(g.kv_dtype for g in f.graphs().values())} KV)" for role, f in manifest.models.items())
    extra = "; kernel contract kept" + ("; loaded and stepped" if args.load else "")
    from ...models.manifest import TREE_FORMAT_VERSION

    if manifest.format_version < TREE_FORMAT_VERSION:  # readable, but graph contract v1
        extra += (f"; format {manifest.format_version}: chain-only, re-export with this edgespec for tree "
                  "verification")
    print(f"{path}: OK ({len(files)} files, {format_bytes(size)}, {how}; {models}{extra})")
    from ...edge.tuned import tuned_elsewhere

    note = tuned_elsewhere(manifest.extra)  # correct anywhere, fastest where tuned: a note, not a problem
    if note:
        print(f"{path}: note: {note}")
    return 0
