"""`edgespec models`: the known models, which of them are in the cache, and the bundles there."""
from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    p = sub.add_parser("models", help="list known models and what is present in the cache",
                       description="List the models `edgespec pull` knows, whether each is in the cache "
                       "(and verified), and the bundles under $EDGESPEC_HOME/bundles.")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--verify", action="store_true",
                   help="hash files that have not been checked yet (otherwise only their size is checked)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ...models import catalog, files, store

    rows = []
    for name in catalog.MODELS:
        st = store.check_model(name, hash_if_needed=args.verify, progress=args.verify and not args.json)
        status = "verified" if st.verified else ("missing" if not st.present else f"present, {st.problem}")
        partial = st.path.parent / f".{st.path.name}.download"
        if not st.verified and partial.is_file():
            status += (f" (partial hub download {partial.stat().st_size / 1e6:.1f} of {st.model.size / 1e6:.1f} MB: "
                       "`edgespec pull` resumes it)")
        rows.append({
            "name": name,
            "role": st.model.role,
            "family": st.model.family,
            "size_mb": round(st.model.size / 1e6),
            "status": status,
            "present": st.present,
            "verified": st.verified,
            "path": str(st.path),
            "description": st.model.description,
            "sources": [s.describe() for s in st.model.sources],
        })
    bundles = list_bundles(files.bundles_dir())
    if args.json:
        print(json.dumps({"home": str(files.edgespec_home()), "models": rows, "bundles": bundles}, indent=2))
        return 0
    print(f"models (cache: {files.models_dir()})")
    w = max(len(r["name"]) for r in rows)
    for r in rows:
        tag = " (default target)" if r["name"] == catalog.DEFAULT_TARGET else (
            " (default draft)" if r["name"] == catalog.DEFAULT_DRAFT else "")
        print(f"  {r['name']:<{w}}  {r['size_mb']:>5} MB  {r['status']}{tag}")
        print(f"  {'':<{w}}  {r['description']}")
    print(f"bundles ({files.bundles_dir()})")
    if not bundles:
        print("  none (`edgespec quickstart` exports the default one)")
    for b in bundles:
        print(f"  {b['name']:<{w}}  {b['status']}  {b['path']}")
    return 0


def list_bundles(root) -> list[dict]:
    """Bundles under `root`, each judged by the one strict reading Bundle.open and `edgespec verify`
    run (verify.check: a bundle refused there is "not usable" here, with verify's first line), less
    the hashing of the weights (sizes are checked): listing stays quick, and a bundle listed "ok"
    is one `serve` opens."""
    from .verify import check

    out = []
    if not root.is_dir():
        return out
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if d.name.endswith(".partial"):
            out.append({"name": d.name, "path": str(d), "status": "unfinished export (in progress, or left by an interrupted one)"})
            continue
        manifest, problems = check(d, checksums=False)
        if manifest is None or problems:
            status = f"not usable: {problems[0] if problems else 'no manifest'}"
        else:
            roles = "+".join(manifest.models)
            status = f"ok ({roles})"
        out.append({"name": d.name, "path": str(d), "status": status})
    return out
