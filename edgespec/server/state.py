"""What every handler shares: the config, the scheduler, the metrics, the engine once it is loaded,
and the serving phase (loading -> ready -> draining, or failed)."""
from __future__ import annotations

import secrets
import time
from pathlib import Path

from .config import ServerConfig
from .metrics import Metrics
from .reload import ReloadGate
from .scheduler import Scheduler
from .served import ServedEngine
from .validate import Limits

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"


class ServerState:
    """Everything the handlers share. `phase`: loading -> ready -> draining, or failed."""

    def __init__(self, config: ServerConfig, scheduler: Scheduler, *, default_name: str = "edgespec",
                 api_key: str | None = None):
        self.config = config
        self.scheduler = scheduler
        self.metrics = Metrics()
        self.reloads = ReloadGate(config.reload_interval)  # POST /v1/docs/reload and SIGHUP, coalesced
        self.api_key = api_key
        self.engine: ServedEngine | None = None
        self.embedder = None  # an OnnxEmbedder when `serve --embedder` loaded one: POST /v1/embeddings
        self.phase = "loading"
        self.failure: str | None = None
        self.model_id = config.model_names[0] if config.model_names else default_name
        self.names = tuple(dict.fromkeys([self.model_id, *config.model_names, default_name]))
        self.limits = Limits(self.names, config.max_tokens_limit, config.default_max_tokens, config.default_temperature)
        self.created = int(time.time())
        self.static = static_files(STATIC_DIR) if config.ui else {}
        # the kiosk page's session when an API key is set (access.py): new with every process
        self.session = secrets.token_urlsafe(32) if config.ui and api_key else None

    @property
    def docs(self):
        """The loaded engine's documents (serve --docs): None before an engine is loaded, or without."""
        return self.engine.docs if self.engine is not None else None

    def set_engine(self, engine: ServedEngine) -> None:
        """Called once the engine is loaded and warm; from then on /ready is 200."""
        self.engine = engine
        name = engine.model_name
        if name:
            self.names = tuple(dict.fromkeys([*self.names, name]))
        # max_tokens is not capped by the cache: a request that outgrows it ends with finish_reason
        # "length" (the engine's "cache_full"), as a long chat on a small-memory board should
        self.limits = Limits(self.names, self.config.max_tokens_limit, self.config.default_max_tokens,
                             self.config.default_temperature)


def static_files(root: Path) -> dict[str, Path]:
    """URL path -> file, listed once at start-up from the package's own folder. Requests are looked up
    in this table and never joined onto a filesystem path, so no URL can reach another file."""
    files: dict[str, Path] = {}
    if not root.is_dir():
        return files
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or p.is_symlink() or not p.is_file():
            continue
        files["/" + rel.as_posix()] = p
        files["/static/" + rel.as_posix()] = p
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    return files
