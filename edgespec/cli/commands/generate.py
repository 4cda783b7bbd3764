"""`edgespec generate BUNDLE -p "..."`: one completion, streamed to stdout, stats to stderr.

Also home of the options and helpers `edgespec chat` shares (opening the engine, the stats line).
"""
from __future__ import annotations

import argparse
import json
import sys

from ...drafters import modes
from ...edge.providers import default_order_text
from ...limits import K_LIMIT, TREE_MODES, suffix_memory_text

TREE_HELP = ("tree verification: auto (a tree only when measured costs say it pays; default), on (always widen "
             "drafts into a tree), off (chains only)")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Options that decide how the engine is opened (shared by generate and chat)."""
    p.add_argument("bundle", help="bundle folder (or the name of one under $EDGESPEC_HOME/bundles)")
    p.add_argument("--draft", choices=modes.NAMES, default="auto", help=f"drafting: {modes.help_text()}")
    p.add_argument("--k", type=int, default=None, metavar="N",
                   help=f"proposals per round (1-{K_LIMIT}); default: chosen every round from measured costs")
    p.add_argument("--tree", choices=TREE_MODES, default="auto", help=TREE_HELP)
    p.add_argument("--max-len", type=int, default=None, metavar="N",
                   help="cache length in tokens, prompt + output (default: the bundle's, from export --max-context, "
                        "capped by the device profile's and the memory budget)")
    p.add_argument("--deterministic", action="store_true",
                   help="the same request gives the same tokens whatever the cache holds and whichever drafter "
                        "runs (chains only; sampled requests are not drafted; docs/runtime.md)")
    p.add_argument("--suffix-capacity", type=int, default=None, metavar="TOKENS",
                   help="tokens of earlier requests and answers the suffix index keeps for drafting (the oldest "
                        f"are evicted; {suffix_memory_text()})")
    p.add_argument("--threads", type=int, default=None,
                   help="onnxruntime intra-op threads (default: the device profile's, else all cores)")
    p.add_argument("--providers", default=None,
                   help="execution providers for the target, in order, e.g. cuda,cpu (default: the device "
                        f"profile's, else {default_order_text()}; tensorrt only when named)")
    p.add_argument("--draft-providers", default=None,
                   help="execution providers for the draft model, e.g. cpu (default: the device profile's, else "
                        "those of the target)")
    p.add_argument("--device", default="auto",
                   help="device profile (e.g. orin-nano, rpi5-8gb; generic-x86_64 or generic-aarch64 for no board "
                        "defaults); its provider orders, threads and memory budget fill what is not given "
                        "(default: auto, the board this runs on, as `edgespec doctor` shows it)")
    p.add_argument("--memory-budget", default=None, metavar="SIZE", help="e.g. 3GiB: shrinks the cache or drops the draft")
    p.add_argument("--power-budget", default=None, metavar="WATTS", help="e.g. 10W (needs a power sensor)")
    p.add_argument("--max-temp", default=None, metavar="C", help="e.g. 80C")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the bundle (sizes are still checked)")
    p.add_argument("--docs", default=None, metavar="INDEX",
                   help="answer chat turns from this document index (`edgespec index`; docs/kiosk.md)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=256, metavar="N")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = off")
    p.add_argument("--seed", type=int, default=None, metavar="S")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop when this text appears (repeatable)")


def register(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate text from a bundle (streams to stdout)",
        description="Generate a completion with speculative decoding. Text streams to stdout; speed and "
                    "acceptance statistics go to stderr (or everything as one JSON object with --json).")
    add_engine_args(p)
    p.add_argument("-p", "--prompt", required=True, help="the prompt; '-' reads it from stdin")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user message in the bundle's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    add_sampling_args(p)
    p.add_argument("--json-schema", default=None, metavar="FILE",
                   help="the answer follows this JSON schema (docs/structured-output.md)")
    p.add_argument("--grammar", default=None, metavar="FILE",
                   help="the answer follows this grammar, in llguidance's Lark form (docs/structured-output.md)")
    p.add_argument("--json", action="store_true", help="print one JSON object (text, finish_reason, stats), no streaming")
    p.add_argument("--quiet", action="store_true", help="no progress line while the bundle loads (shown on a terminal only)")
    p.set_defaults(func=run)


def structured_kwargs(args: argparse.Namespace) -> dict:
    """--json-schema / --grammar FILE -> generate's keywords; a file that cannot be read, or a
    schema that is not JSON, is an InvalidRequest naming the file (exit 1)."""
    from ...errors import InvalidRequest

    out = {}
    for flag, key in (("--json-schema", "json_schema"), ("--grammar", "grammar")):
        path = getattr(args, key)
        if path is None:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidRequest(f"{flag} {path}: cannot be read ({e})", param=flag) from None
        if key == "json_schema":
            try:
                json.loads(text)
            except ValueError as e:
                raise InvalidRequest(f"{flag} {path}: not valid JSON ({e})", param=flag) from None
        out[key] = text
    return out


def engine_settings(args: argparse.Namespace):
    """The flags -> the engine's Settings, checked once (engine/settings.py)."""
    from ...engine.settings import Settings

    return Settings.of(
        draft=args.draft, k=args.k, tree=args.tree, max_len=args.max_len, providers=args.providers,
        draft_providers=args.draft_providers, threads=args.threads, device=args.device,
        memory_budget=args.memory_budget, power_budget=args.power_budget, max_temp=args.max_temp,
        verify=not args.no_verify, deterministic=args.deterministic, docs=getattr(args, "docs", None),
        **({} if args.suffix_capacity is None else {"suffix_capacity": args.suffix_capacity}),
    )


def open_engine(args: argparse.Namespace):
    """The bundle checked, then the engine opened, with a progress line on a terminal (cli/loading.py):
    the two steps that take seconds, tens of them from a Pi's SD card."""
    from ...engine import Engine
    from ...models.bundle import Bundle, resolve_bundle
    from ...units import format_size
    from ..loading import LoadProgress

    settings = engine_settings(args)
    with LoadProgress(str(args.bundle), quiet=getattr(args, "quiet", False)) as progress:
        progress.stage("checking the bundle" + (" (sha256 of every file)" if settings.verify else ""))
        bundle = Bundle.open(resolve_bundle(args.bundle), verify=settings.verify)
        size = sum(bundle.model_bytes(role) for role in bundle.manifest.models)
        progress.stage(f"loading the models ({format_size(size)}) and timing their steps")
        return Engine.open(bundle, settings)


def sampling_kwargs(args: argparse.Namespace) -> dict:
    return dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                top_k=args.top_k, seed=args.seed, stop=args.stop)


def stats_line(result) -> str:
    s = result.stats
    parts = [f"{s.new_tokens} tokens", f"{s.decode_tokens_per_second:.1f} tok/s", f"TTFT {s.ttft_s:.2f} s"]
    if s.cached_tokens:
        parts.append(f"{s.cached_tokens} prompt tokens reused")
    if s.drafted:
        parts.append(f"acceptance {100 * s.acceptance_rate:.0f} % ({s.accepted}/{s.drafted})")
    parts.append(f"{s.tokens_per_pass:.2f} tokens/pass")
    if s.rounds_by_source:
        mix = ", ".join(f"{k} {v}" for k, v in sorted(s.rounds_by_source.items()))
        parts.append(f"drafter {s.drafter} (rounds: {mix})")
    else:
        parts.append(f"drafter {s.drafter}")
    if s.tree_rounds:
        depth = sum(d * n for d, n in s.accepted_depth.items()) / s.tree_rounds
        parts.append(f"tree rounds {s.tree_rounds} ({s.tree_nodes / s.tree_rounds:.1f} nodes, accepted depth "
                     f"{depth:.2f}, {s.tree_off_chain} off the chain)")
    if s.energy_j_per_token is not None:
        parts.append(f"{s.energy_j_per_token:.2f} J/token")
    parts.append(f"finish {result.finish_reason}")
    return "[" + "; ".join(parts) + "]"


def run(args: argparse.Namespace) -> int:
    from ...errors import InvalidRequest

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    structured = structured_kwargs(args)  # before the bundle is opened: a bad file costs nothing
    eng = open_engine(args)
    try:
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else [])
            messages.append({"role": "user", "content": prompt})
            req = dict(messages=messages)
        else:
            req = dict(prompt=prompt)
        try:
            stream = eng.stream(**req, **sampling_kwargs(args), **structured)
        except InvalidRequest as e:
            if e.param in structured:  # the library refused the schema or grammar: name the file
                flag = "--" + e.param.replace("_", "-")
                raise InvalidRequest(f"{flag} {getattr(args, e.param)}: {e}", param=flag) from None
            raise
        if args.json:
            for _ in stream:
                pass
            r = stream.result
            print(json.dumps({"text": r.text, "finish_reason": r.finish_reason, "token_ids": r.token_ids,
                              "stats": r.stats.to_dict(), "model": eng.model_name}, ensure_ascii=False))
            return 0
        for delta in stream:
            sys.stdout.write(delta)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(stats_line(stream.result), file=sys.stderr)
        return 0
    finally:
        eng.close()
