"""`edgespec` command line: one subcommand per module in edgespec/cli/commands/.

Each command module defines `register(subparsers)`, which adds its parser and sets `func`.
Command modules import heavy things (onnxruntime, torch, the server) inside their functions, so
`edgespec --help` and every command start fast.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .. import __version__
from ..errors import EdgespecError

# (module under edgespec.cli.commands, in help order)
COMMANDS = ("pull", "models", "export", "verify", "generate", "chat", "bench", "loadtest", "serve", "doctor", "plan",
            "quickstart")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="edgespec",
        description="Speculative decoding for LLMs on edge devices (Jetson, Raspberry Pi), on onnxruntime.",
    )
    ap.add_argument("--version", action="version", version=f"edgespec {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f".commands.{name}", __package__).register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not getattr(args, "func", None):
        ap.print_help()
        return 2
    try:
        rc = args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except EdgespecError as e:
        print(f"edgespec {args.command}: error: {e}", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
