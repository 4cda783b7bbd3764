"""`edgespec chat BUNDLE`: an interactive conversation, streamed.

Each turn sends the whole conversation; the engine keeps its cache between turns and rewinds only
to where the new prompt differs, so a turn prefills just the new text (the stats line shows how
many prompt tokens were reused). Commands: /reset (new conversation), /exit (or Ctrl-D).
"""
from __future__ import annotations

import argparse
import sys

from .generate import add_engine_args, add_sampling_args, open_engine, sampling_kwargs, stats_line


def register(sub) -> None:
    p = sub.add_parser(
        "chat", help="interactive chat with a bundle (streaming, keeps the conversation's cache)",
        description="Chat with a bundle's model. Type a message and press Enter; /reset starts over, "
                    "/exit or Ctrl-D quits. Lines read from a pipe are turns too.")
    add_engine_args(p)
    add_sampling_args(p)
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("--quiet", action="store_true", help="no progress line while the bundle loads, no stats line after each reply")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ...errors import InvalidRequest

    eng = open_engine(args)
    interactive = sys.stdin.isatty()
    base = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(base)
    if interactive:
        print(f"edgespec chat: {eng.model_name} (max_len {eng.max_len}, draft {args.draft}); "
              "/reset starts over, /exit quits", file=sys.stderr)
    try:
        while True:
            if interactive:
                print("> ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            if not line:
                break
            text = line.rstrip("\n")
            if not text.strip():
                continue
            if text.strip() in ("/exit", "/quit"):
                break
            if text.strip() == "/reset":
                messages = list(base)
                print("(new conversation)", file=sys.stderr)
                continue
            messages.append({"role": "user", "content": text})
            try:
                stream = eng.stream(messages=messages, **sampling_kwargs(args))
            except InvalidRequest as e:  # e.g. the conversation outgrew the cache: say so, keep going
                messages.pop()
                print(f"error: {e} (/reset starts a new conversation)", file=sys.stderr)
                continue
            try:
                for delta in stream:
                    sys.stdout.write(delta)
                    sys.stdout.flush()
            except KeyboardInterrupt:  # Ctrl-C stops this reply, not the chat
                stream.close()
                print("\n(interrupted)", file=sys.stderr)
                messages.pop()
                continue
            sys.stdout.write("\n")
            sys.stdout.flush()
            r = stream.result
            for src in (r.docs or {}).get("sources", []):  # --docs: the passages the answer was given
                print(f"  [{src['id']}] {src['title']} ({src['file']}, characters {src['start']}-{src['end']})")
            messages.append({"role": "assistant", "content": r.text})
            if not args.quiet:
                print(stats_line(r), file=sys.stderr)
        return 0
    finally:
        eng.close()
