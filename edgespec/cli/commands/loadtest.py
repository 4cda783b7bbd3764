"""`edgespec loadtest BUNDLE --concurrency 1,2,4`: concurrent streaming clients over the HTTP API,
serial server against batched server, in one run (see edgespec/loadtest.py and docs/server.md)."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser(
        "loadtest", help="N concurrent streaming clients against the serial and the batched server",
        description="Serve the bundle in this process, first one request at a time (--parallel 1), then batched "
                    "(--parallel = the largest concurrency level), and run the same streaming chat requests from "
                    "N concurrent clients against each: aggregate tok/s, per-request tok/s, TTFT p50/p95.")
    p.add_argument("bundle", nargs="?", help="bundle folder (or the name of one under $EDGESPEC_HOME/bundles); "
                   "not with --url")
    p.add_argument("--url", help="measure an OpenAI-compatible server that is already running instead (e.g. "
                   "llama.cpp's llama-server: http://127.0.0.1:8080); it drafts as it was started")
    p.add_argument("--label", default="external", help="the server's name in the report with --url (default external)")
    p.add_argument("--concurrency", default="1,2,4", help="client counts, comma-separated (default 1,2,4)")
    p.add_argument("--draft", default="none,auto", help="drafting modes to run, comma-separated (default none,auto)")
    p.add_argument("--prompts", default="code", help="prompt set(s) or .jsonl file(s), as in bench (default code)")
    p.add_argument("--requests", type=int, default=8, help="requests per level: the set's first N (default 8)")
    p.add_argument("--max-tokens", type=int, default=64, help="completion tokens per request (default 64)")
    p.add_argument("--max-len", type=int, default=1024, help="KV cache length per slot (default 1024)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads per session")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    p.set_defaults(func=run)


def run(args) -> int:
    from ...bench.loadtest import loadtest, loadtest_url, parse_levels
    from ...engine import build
    from ...engine.settings import Settings
    from ...errors import InvalidRequest
    from ...models.bundle import resolve_bundle

    levels = parse_levels(args.concurrency)
    if getattr(args, "url", None) is not None:
        if args.bundle is not None:
            raise InvalidRequest("give a bundle (served here) or --url (a running server), not both", param="url")
        results = loadtest_url(args.url, levels=levels, prompts=args.prompts, requests=args.requests,
                               max_tokens=args.max_tokens, label=args.label, progress=progress)
        return _done(results, args)
    if args.bundle is None:
        raise InvalidRequest("loadtest needs a bundle to serve, or --url of a running server", param="bundle")
    drafts = [d.strip() for d in args.draft.split(",") if d.strip()]
    bundle = resolve_bundle(args.bundle)
    for d in drafts:  # what the bundle cannot draft with is refused before any server starts
        build.plan(Settings.of(draft=d, parallel=2, max_len=args.max_len, verify=False), bundle)
    opts = {"max_len": args.max_len, "verify": False}
    if args.threads is not None:
        opts["threads"] = args.threads
    results = loadtest(bundle, levels=levels, drafts=drafts, prompts=args.prompts,
                       requests=args.requests, max_tokens=args.max_tokens, engine_options=opts, progress=progress)
    return _done(results, args)


def progress(r) -> None:
    print(f"  {r.server} draft={r.draft} clients={r.concurrency}: {r.aggregate_tps:.2f} tok/s aggregate", flush=True)


def _done(results, args) -> int:
    from ...bench.loadtest import report

    print(report(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([r.to_dict() for r in results], f, indent=2)
    return 0
