"""`edgespec serve BUNDLE`: the OpenAI-compatible HTTP server (see docs/server.md).

Every option can also come from an EDGESPEC_* environment variable (the systemd unit reads them from
/etc/edgespec/edgespec.env); a command-line option wins over the environment. The API key is read
from a file only, never from an option value or a variable holding the key itself.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Callable

from ...drafters import modes
from ...edge.providers import default_order_text
from ...limits import PARALLEL_LIMIT, TREE_MODES, suffix_memory_text

# EX_CONFIG from sysexits.h: the unit's RestartPreventExitStatus=78 keeps systemd from restarting a
# service that cannot start (bad bundle, bad option) in a loop
EXIT_CONFIG = 78

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _env(name: str, cast: Callable[[str], Any] = str, default: Any = None) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return cast(raw.strip())
    except ValueError:
        from ...server.config import ConfigError

        raise ConfigError(f"environment variable {name}={raw!r} is not valid ({cast.__name__} expected)") from None


def _bool(text: str) -> bool:
    t = text.lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError(text)


_bool.__name__ = "yes/no"


def _list(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


_list.__name__ = "comma-separated list"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="OpenAI-compatible HTTP server (chat/completions, streaming, metrics)",
        description="Serve a bundle over an OpenAI-compatible HTTP API. Every option also reads an "
        "EDGESPEC_* environment variable (shown in brackets); options on the command line win.",
    )
    p.add_argument("bundle", nargs="?", help="bundle folder, or the name of one under $EDGESPEC_HOME/bundles "
                   "[EDGESPEC_BUNDLE]")
    net = p.add_argument_group("network and security")
    net.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only) [EDGESPEC_HOST]")
    net.add_argument("--port", type=int, help="TCP port (default 8000; 0 picks a free one) [EDGESPEC_PORT]")
    net.add_argument("--api-key-file", metavar="FILE",
                     help="require 'Authorization: Bearer <key>' with the key in FILE (also picked up from "
                     "systemd's LoadCredential=api-key) [EDGESPEC_API_KEY_FILE]")
    net.add_argument("--model-name", action="append", metavar="NAME",
                     help="model id shown by /v1/models and accepted in requests (repeat for aliases; default: "
                     "the bundle folder's name) [EDGESPEC_MODEL_NAME, comma-separated]")
    net.add_argument("--allowed-hosts", metavar="NAMES", type=_list,
                     help="Host header names clients use besides the bound address, loopback and (when bound to "
                     "all interfaces) IP addresses, comma-separated, e.g. kiosk.local; '*' turns the check off "
                     "[EDGESPEC_ALLOWED_HOSTS]")
    net.add_argument("--cors-origin", action="append", metavar="ORIGIN",
                     help="a web origin other than the server's own whose pages may call the API, e.g. "
                     "https://app.example (repeat for more; '*': any) [EDGESPEC_CORS_ORIGIN, comma-separated]")
    ui = net.add_mutually_exclusive_group()
    ui.add_argument("--ui", dest="ui", action="store_true", default=None,
                    help="serve the kiosk chat page at / [EDGESPEC_UI=1]")
    ui.add_argument("--no-ui", dest="ui", action="store_false", help="no page at / (the default)")

    lim = p.add_argument_group("limits")
    lim.add_argument("--queue-size", type=int, help="requests that may wait while one generates; more get 429 "
                     "(default 8) [EDGESPEC_QUEUE_SIZE]")
    lim.add_argument("--request-timeout", type=float, help="seconds a request may take, queue included; then 504 "
                     "(default 300) [EDGESPEC_REQUEST_TIMEOUT]")
    lim.add_argument("--drain-timeout", type=float, help="on SIGTERM, seconds the running request may still take "
                     "(default 10) [EDGESPEC_DRAIN_TIMEOUT]")
    lim.add_argument("--max-body-bytes", type=int, help="larger request bodies get 413 (default 1048576) "
                     "[EDGESPEC_MAX_BODY_BYTES]")
    lim.add_argument("--max-tokens-limit", type=int, help="largest max_tokens a request may ask for (default 4096; a "
                     "request that outgrows the cache ends with finish_reason length) [EDGESPEC_MAX_TOKENS_LIMIT]")
    lim.add_argument("--default-max-tokens", type=int, help="max_tokens when a request gives none (default 512) "
                     "[EDGESPEC_DEFAULT_MAX_TOKENS]")
    lim.add_argument("--default-temperature", type=float, help="temperature when a request gives none (default 0: "
                     "greedy) [EDGESPEC_DEFAULT_TEMPERATURE]")
    lim.add_argument("--header-timeout", type=float, help="seconds a client has to send a request's headers; then "
                     "408 and the connection is closed (default 10) [EDGESPEC_HEADER_TIMEOUT]")
    lim.add_argument("--body-timeout", type=float, help="seconds a client has to send a request's body after its "
                     "headers; then 408 (default 30) [EDGESPEC_BODY_TIMEOUT]")
    lim.add_argument("--max-connections", type=int, help="open connections at most (default max(64, 4 x queue "
                     "size)) [EDGESPEC_MAX_CONNECTIONS]")
    lim.add_argument("--max-connections-per-client", type=int, help="open connections from one address at most "
                     "(default half of --max-connections) [EDGESPEC_MAX_CONNECTIONS_PER_CLIENT]")
    lim.add_argument("--no-warmup", dest="warmup", action="store_false", default=None,
                     help="skip the warm-up generation before READY [EDGESPEC_WARMUP=0]")

    lim.add_argument("--parallel", help="requests generating at once, verified together in one target pass "
                     "(continuous batching; every drafting mode and tree mode runs); 'auto': as many as the memory plan "
                     "fits, up to 4. Default 1: one at a time, the others queue [EDGESPEC_PARALLEL]")

    eng = p.add_argument_group("engine (one Settings, checked before the bundle loads)")
    eng.add_argument("--draft", choices=modes.NAMES,
                     help=f"default drafting of requests (a request may pass its own 'draft'): {modes.help_text()} "
                     "[EDGESPEC_DRAFT]")
    eng.add_argument("--k", type=int, help="tokens drafted per round (default: chosen by measured cost) [EDGESPEC_K]")
    eng.add_argument("--tree", choices=TREE_MODES,
                     help="default tree verification of requests (a request may pass its own 'tree'): auto | on | "
                     "off (default auto) [EDGESPEC_TREE]")
    eng.add_argument("--max-len", type=int, help="KV cache length in tokens (default: the bundle's, from export "
                     "--max-context, capped by the device profile's and the memory plan) [EDGESPEC_MAX_LEN]")
    eng.add_argument("--deterministic", action="store_true", default=None,
                     help="the same request gets the same tokens whatever the cache holds, whatever it is batched "
                     "with and whichever drafter runs (chains only; sampled requests are not drafted; "
                     "docs/runtime.md) [EDGESPEC_DETERMINISTIC=1]")
    eng.add_argument("--suffix-capacity", type=int, metavar="TOKENS", help="tokens of earlier requests and "
                     f"answers the suffix index keeps for drafting (the oldest evicted; {suffix_memory_text()}; "
                     "with --parallel the shared history of finished requests, read in place by every running "
                     "request beside an index of its own text) [EDGESPEC_SUFFIX_CAPACITY]")
    eng.add_argument("--embedder", metavar="NAME|DIR", help="a sentence-embedding model for POST /v1/embeddings: "
                     "a name `edgespec pull` exported (all-minilm-l6-v2) or its folder [EDGESPEC_EMBEDDER]")
    eng.add_argument("--system-prompt", metavar="FILE", help="a system prompt (UTF-8 text file) every "
                     "conversation starts with: prefilled before READY, kept in the cache across conversations and "
                     "saved under $EDGESPEC_HOME/pinned so a restart starts warm (with --parallel N: prefilled in every "
                     "slot, not saved); the kiosk page sends it when its URL sets none [EDGESPEC_SYSTEM_PROMPT]")
    eng.add_argument("--docs", metavar="INDEX", help="answer chat turns from this document index (`edgespec "
                     "index`), each reply with its sources; SIGHUP or POST /v1/docs/reload reads it again after "
                     "a rebuild (any --parallel; docs/kiosk.md) [EDGESPEC_DOCS]")
    eng.add_argument("--memory-budget", metavar="SIZE", help="memory the engine may use, e.g. 3GiB: shrinks the "
                     "cache or drops the draft [EDGESPEC_MEMORY_BUDGET]")
    eng.add_argument("--power-budget", metavar="WATTS", help="e.g. 10W (needs a power sensor) [EDGESPEC_POWER_BUDGET]")
    eng.add_argument("--max-temp", metavar="C", help="e.g. 80C [EDGESPEC_MAX_TEMP]")
    eng.add_argument("--device", help="device profile whose provider orders, threads and memory budget fill what "
                     "is not given (default: auto, this board as `edgespec doctor` detects it) [EDGESPEC_DEVICE]")
    eng.add_argument("--providers", help="execution providers for the target, comma-separated, e.g. cuda,cpu "
                     f"(default: the device profile's, else {default_order_text()}; tensorrt only when named) "
                     "[EDGESPEC_PROVIDERS]")
    eng.add_argument("--draft-providers", help="execution providers for the draft [EDGESPEC_DRAFT_PROVIDERS]")
    eng.add_argument("--threads", type=int, help="CPU threads per session [EDGESPEC_THREADS]")
    eng.add_argument("--no-verify", dest="verify", action="store_false", default=None,
                     help="skip the sha256 check of the bundle at start (sizes are still checked) [EDGESPEC_VERIFY=0]")
    p.set_defaults(func=run)


def _pick(value: Any, env_name: str, cast: Callable[[str], Any] = str, default: Any = None) -> Any:
    return value if value is not None else _env(env_name, cast, default)


def server_config(args: argparse.Namespace):
    from ...server.config import ServerConfig

    names = args.model_name or _env("EDGESPEC_MODEL_NAME", _list, [])
    return ServerConfig(
        host=_pick(args.host, "EDGESPEC_HOST", str, "127.0.0.1"),
        port=_pick(args.port, "EDGESPEC_PORT", int, 8000),
        queue_size=_pick(args.queue_size, "EDGESPEC_QUEUE_SIZE", int, 8),
        request_timeout=_pick(args.request_timeout, "EDGESPEC_REQUEST_TIMEOUT", float, 300.0),
        drain_timeout=_pick(args.drain_timeout, "EDGESPEC_DRAIN_TIMEOUT", float, 10.0),
        max_body_bytes=_pick(args.max_body_bytes, "EDGESPEC_MAX_BODY_BYTES", int, 1 << 20),
        max_tokens_limit=_pick(args.max_tokens_limit, "EDGESPEC_MAX_TOKENS_LIMIT", int, 4096),
        default_max_tokens=_pick(args.default_max_tokens, "EDGESPEC_DEFAULT_MAX_TOKENS", int, 512),
        default_temperature=_pick(args.default_temperature, "EDGESPEC_DEFAULT_TEMPERATURE", float, 0.0),
        api_key_file=_pick(args.api_key_file, "EDGESPEC_API_KEY_FILE", str, None),
        ui=_pick(args.ui, "EDGESPEC_UI", _bool, False),
        model_names=list(names),
        warmup=_pick(args.warmup, "EDGESPEC_WARMUP", _bool, True),
        parallel=1,  # set by run() once --parallel is resolved (auto needs the bundle)
        allowed_hosts=_pick(args.allowed_hosts, "EDGESPEC_ALLOWED_HOSTS", _list, []),
        cors_origins=list(args.cors_origin or _env("EDGESPEC_CORS_ORIGIN", _list, [])),
        header_timeout=_pick(args.header_timeout, "EDGESPEC_HEADER_TIMEOUT", float, 10.0),
        body_timeout=_pick(args.body_timeout, "EDGESPEC_BODY_TIMEOUT", float, 30.0),
        max_connections=_pick(args.max_connections, "EDGESPEC_MAX_CONNECTIONS", int, 0),
        max_connections_per_client=_pick(args.max_connections_per_client, "EDGESPEC_MAX_CONNECTIONS_PER_CLIENT", int, 0),
    )


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """Only what was given (flag, else environment): Settings' own defaults (and the device profile)
    decide the rest."""
    opts = {
        "draft": _pick(args.draft, "EDGESPEC_DRAFT"),
        "k": _pick(args.k, "EDGESPEC_K", int),
        "tree": _pick(args.tree, "EDGESPEC_TREE"),
        "max_len": _pick(args.max_len, "EDGESPEC_MAX_LEN", int),
        "suffix_capacity": _pick(getattr(args, "suffix_capacity", None), "EDGESPEC_SUFFIX_CAPACITY", int),
        "memory_budget": _pick(args.memory_budget, "EDGESPEC_MEMORY_BUDGET"),
        "power_budget": _pick(args.power_budget, "EDGESPEC_POWER_BUDGET"),
        "max_temp": _pick(args.max_temp, "EDGESPEC_MAX_TEMP"),
        "device": _pick(args.device, "EDGESPEC_DEVICE"),
        "providers": _pick(args.providers, "EDGESPEC_PROVIDERS"),
        "draft_providers": _pick(args.draft_providers, "EDGESPEC_DRAFT_PROVIDERS"),
        "threads": _pick(args.threads, "EDGESPEC_THREADS", int),
        "verify": _pick(args.verify, "EDGESPEC_VERIFY", _bool),
        "deterministic": _pick(getattr(args, "deterministic", None), "EDGESPEC_DETERMINISTIC", _bool),
        "docs": _pick(getattr(args, "docs", None), "EDGESPEC_DOCS"),
    }
    return {k: v for k, v in opts.items() if v is not None}


class _JournalFormatter(logging.Formatter):
    """Under systemd (JOURNAL_STREAM set) each line starts with <priority>, which journald turns into the
    entry's level: `journalctl -p warning -u edgespec` then shows just the problems."""

    LEVELS = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

    def format(self, record: logging.LogRecord) -> str:
        prio = self.LEVELS.get(record.levelno, 6)
        return "\n".join(f"<{prio}>{line}" for line in super().format(record).splitlines())


def _journal_logging() -> None:
    if not os.environ.get("JOURNAL_STREAM"):
        return
    for h in logging.getLogger().handlers:
        h.setFormatter(_JournalFormatter("%(name)s: %(message)s"))


def _parallel(value, path, settings) -> int:
    """--parallel / EDGESPEC_PARALLEL: an integer, or 'auto' (the memory plan's slot count)."""
    from ...server.config import ConfigError

    raw = value if value is not None else _env("EDGESPEC_PARALLEL", str, "1")
    if str(raw).strip().lower() == "auto":
        from ...engine.build import auto_slots

        return auto_slots(path, settings)
    try:
        n = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"--parallel must be an integer or 'auto', got {raw!r}") from None
    if not 1 <= n <= PARALLEL_LIMIT:
        raise ConfigError(f"--parallel must be from 1 to {PARALLEL_LIMIT}, got {n}")
    return n


def system_prompt(value) -> str | None:
    """--system-prompt FILE / EDGESPEC_SYSTEM_PROMPT: the file's text, checked before the bundle loads."""
    from ...server.config import ConfigError

    path = value if value is not None else _env("EDGESPEC_SYSTEM_PROMPT")
    if not path:
        return None
    try:
        text = open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--system-prompt {path}: cannot be read ({e})") from None
    if not text.strip():
        raise ConfigError(f"--system-prompt {path} is empty")
    return text.strip()


def engine_opener(path, settings, system: str | None) -> Callable[[], Any]:
    """What the service calls to load its engine (one engine at every --parallel: its slots are
    settings.parallel), with the pinned system prompt (and a venue read in the cache) before it
    serves anyone."""

    def open_engine():
        from ...engine import Engine

        eng = Engine.open(path, settings)
        if system is not None or (eng.docs is not None and eng.docs.in_cache):
            from ...engine.pinned import pin_system_prompt
            from ...models.files import edgespec_home

            pin_system_prompt(eng, system, save_dir=edgespec_home() / "pinned")
        return eng

    return open_engine


def run(args: argparse.Namespace) -> int:
    from ...errors import BundleNotFound, EdgespecError

    _journal_logging()
    try:
        bundle = args.bundle or _env("EDGESPEC_BUNDLE")
        if not bundle:
            raise BundleNotFound("no bundle given: `edgespec serve BUNDLE` (or EDGESPEC_BUNDLE in the environment)")
        from ...models.bundle import not_found_message, resolve_bundle

        path = resolve_bundle(bundle)
        if not path.exists():
            raise BundleNotFound(not_found_message(bundle))
        if path.name == "manifest.json":
            path = path.parent
        config = server_config(args)
        from ...engine.settings import Settings

        options = engine_options(args)
        options.setdefault("device", "auto")  # like generate and chat: this board's defaults
        settings = Settings.of(**options)  # every engine option checked once, before the bundle loads
        parallel = _parallel(getattr(args, "parallel", None), path, settings)
        config.parallel = parallel
        settings = settings.replace(parallel=parallel)  # the slot count checked here

        system = system_prompt(getattr(args, "system_prompt", None))
        embedder_spec = _pick(getattr(args, "embedder", None), "EDGESPEC_EMBEDDER")
        embedder = None
        if embedder_spec:  # small (26 MB) and checked like a bundle: loaded here, before the LLM, refused in one line
            from ...docs.embedder import load_embedder

            embedder = load_embedder(embedder_spec, threads=settings.threads)

        from ...server.service import Service

        service = Service(config, engine_opener(path, settings, system), default_name=path.resolve().name)
        if embedder is not None:  # the state's default is None
            service.state.embedder = embedder
        return service.run()
    except EdgespecError as e:
        print(f"edgespec serve: error: {e}", file=sys.stderr)
        return EXIT_CONFIG
