"""A bundle folder checked against its manifest: the schema and the digest (models/manifest.py),
every listed file inside the bundle with its size and sha256 and nothing unlisted beside them
(models/bundlefiles.py), and the manifest's facts against the graphs themselves (graphfacts.py,
kernelcheck.py). models/bundle.py's read_bundle runs this first, then the tokenizer and the chat
template: that is the one strict reading `verify`, `models`, `quickstart` and Bundle.open share.
"""
from __future__ import annotations

import os
from pathlib import Path

from .bundlefiles import file_problems, outside, read_json, stray_problems
from .manifest import (CONTRACT_INPUTS, CUDA_FORMAT_VERSION, FORMAT_VERSION, MANIFEST_NAME, TREE_FORMAT_VERSION, Manifest,
                       check_schema, content_digest, sha256_file)


def cuda_format_problems(manifest: Manifest) -> list[str]:
    """A bundle older than contract v3 with a cuda-flavored graph: one line saying to re-export."""
    out = []
    for role, facts in manifest.models.items():
        if "cuda" in facts.graphs():
            path = facts.graphs()["cuda"].path
            out.append(f"{path}: a format-{manifest.format_version} cuda-flavored graph wires attention_bias into "
                       "GroupQueryAttention, which onnxruntime's CUDA kernel refuses on every step: re-export the "
                       f"bundle with this edgespec (`edgespec export ... --ep cuda` writes format {FORMAT_VERSION})")
    return out


def kernel_problems(root: Path, manifest: Manifest) -> list[str]:
    """Each graph checked against its flavor's kernel table: one line per rule a graph breaks."""
    from .graphfacts import GraphFormatError
    from .kernelcheck import check_graph, summarize
    from .kernels import PROVIDER_OF_FLAVOR

    out = []
    for facts in manifest.models.values():
        for flavor, graph in facts.graphs().items():
            provider = PROVIDER_OF_FLAVOR[flavor]
            try:
                found = check_graph(root / graph.path, provider)
            except (OSError, GraphFormatError) as e:
                out.append(f"{graph.path}: not a readable ONNX graph ({e})")
                continue
            out += summarize(found, provider, prefix=f"{graph.path}: ")
    return out


def verify_bundle(root: str | os.PathLike, *, checksums: bool = True) -> tuple[Manifest | None, list[str]]:
    """Reads `root/manifest.json` and checks the schema, that every listed file is inside the
    bundle with its size and sha256, that no unlisted file sits in the bundle, and the facts against
    the graphs. Returns (manifest or None, problems). models/bundle.py's read_bundle adds the
    tokenizer and the chat template: that is what `verify` and Bundle.open run.

    `checksums=False` skips hashing (sizes are still checked) for callers that accept that trade."""
    root = Path(root)
    if not root.is_dir():
        return None, [f"{root}: not a folder"]
    mpath = root / MANIFEST_NAME
    if outside(Path(os.path.realpath(root)), mpath) is not None:
        return None, [f"{MANIFEST_NAME}: a symbolic link out of the bundle: refused"]
    if not mpath.is_file():
        hint = " (a '.partial' folder is an export that did not finish)" if root.name.endswith(".partial") else ""
        return None, [f"{mpath}: missing: not a bundle, or an unfinished export{hint}"]
    d, why = read_json(mpath)
    if why:
        return None, [why]
    try:  # a value nested nearly as deep as json.loads allows can be too deep to print or re-encode
        problems = check_schema(d)
        if problems:
            return None, problems
        if not d.get("digest"):
            problems.append("manifest.json: no digest: not written by `edgespec export`, or edited")
        elif d["digest"] != content_digest(d):
            problems.append("manifest.json: edited after export (its content does not match its digest)")
    except RecursionError:
        return None, ["manifest.json: unreadable JSON: nested too deeply"]
    manifest = Manifest.from_dict(d)
    problems += file_problems(root, manifest.files, checksums, sha256_file)
    if not problems and TREE_FORMAT_VERSION <= manifest.format_version < CUDA_FORMAT_VERSION:
        problems += cuda_format_problems(manifest)  # format 2 wired attention_bias into every graph
    if not problems:  # the facts against the graphs themselves (a digest can be recomputed after an edit)
        from .graphfacts import graph_readable, model_problems

        added = {n for rows in CONTRACT_INPUTS.values() for names in rows.values() for n in names}
        graphs = [(role, g) for role, facts in manifest.models.items() for g in facts.graphs().values()]
        from .derived import bundle_map_problems, graph_problems

        for role, graph in graphs:  # each flavor's graph (export --ep cpu,cuda)
            problems += model_problems(root, role, graph, set(manifest.files), added)
            problems += graph_problems(root, role, graph)  # the facts derived from its nodes
        if manifest.heads is not None:  # the draft heads' graph against its record (method, sizes)
            from .graphfacts import heads_problems

            problems += heads_problems(root, manifest.heads)
        if not problems:  # the maps index graphs whose sizes are now known to be the manifest's
            problems += bundle_map_problems(root, manifest)
        if all(graph_readable(root / g.path) for _, g in graphs):  # each node against its provider's kernels
            problems += kernel_problems(root, manifest)  # (kernelcheck.py), whatever the facts said
    return manifest, problems + stray_problems(root, set(manifest.files) | {MANIFEST_NAME})
