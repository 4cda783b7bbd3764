"""`edgespec` command line: one subcommand per module in edgespec/cli/commands/.

Each command module defines `register(subparsers)`, which adds its parser and sets `func`. Commands
that live in another distribution (`edgespec export`, in export/) register through the
`edgespec.commands` entry point; when that half is not installed, its name still answers, with the
line that installs it.
Command modules import heavy things (onnxruntime, torch, the server) inside their functions, so
`edgespec --help` and every command start fast.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from importlib.metadata import entry_points

from .. import __version__
from ..errors import EdgespecError

# (module under edgespec.cli.commands, in help order)
COMMANDS = ("pull", "models", "verify", "generate", "chat", "bench", "loadtest", "serve", "index", "doctor", "plan",
            "quickstart", "embed")


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
    plugged = {ep.name: ep for ep in entry_points(group="edgespec.commands")}
    for name, install in PLUGGED.items():
        if name in plugged:
            plugged[name].load()(sub)
        else:
            _missing(sub, name, install)
    return ap


# Commands another distribution provides, and how to install it when it is absent.
PLUGGED = {"export": "pip install ./export   (in the edgespec source tree; .gguf sources need no torch; for "
                     "Hugging Face folders and hub ids: pip install torch==2.13.0 && pip install './export[torch]')"}


def _missing(sub, name: str, install: str) -> None:
    p = sub.add_parser(name, help=f"(not installed: {install})", add_help=False)

    def run(_args) -> int:
        raise EdgespecError(f"the {name} half of edgespec is not installed: {install}")

    # any options it is given are the absent command's: main() lets them through to this one line
    p.set_defaults(func=run, takes_any_arguments=True)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    # parse_known_args: a command whose distribution is absent (`export --target X.gguf` on a runtime-only
    # install) answers with its install line, not with argparse's "unrecognized arguments"
    args, extra = ap.parse_known_args(argv)
    if extra and not getattr(args, "takes_any_arguments", False):
        ap.error(f"unrecognized arguments: {' '.join(extra)}")
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
    except BrokenPipeError:  # the reader went away (`edgespec plan X | head`): no traceback for that
        _stdout_to_devnull()
        return 141  # 128 + SIGPIPE, what a shell reports for a command whose reader left
    except EdgespecError as e:
        print(f"edgespec {args.command}: error: {e}", file=sys.stderr)
        return 1
    except ModuleNotFoundError as e:  # a command that reached onnxruntime on an install without one: one line
        if (e.name or "").split(".")[0] != "onnxruntime":
            raise
        from ..errors import MISSING_ONNXRUNTIME

        print(f"edgespec {args.command}: error: {MISSING_ONNXRUNTIME}", file=sys.stderr)
        return 1
    return int(rc or 0)


def _stdout_to_devnull() -> None:
    """Python flushes stdout again at exit, into the same closed pipe: point it at /dev/null first."""
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor: replace the object
        sys.stdout = open(os.devnull, "w")


if __name__ == "__main__":
    sys.exit(main())
