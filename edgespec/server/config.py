"""What `edgespec serve` was told: network, limits, security. Engine options travel separately, as
one engine Settings (engine/settings.py) checked before the bundle loads."""
from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EdgespecError
from ..limits import PARALLEL_LIMIT, TEMPERATURE_LIMIT

log = logging.getLogger(__name__)

# systemd's LoadCredential= puts the key here; preferred over a file the service user must be able to read
CREDENTIAL_NAME = "api-key"


class ConfigError(EdgespecError):
    """A serve option or the environment file is wrong (the service exits without restarting)."""


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    queue_size: int = 8  # requests waiting while one generates; beyond it: 429
    request_timeout: float = 300.0  # seconds from arrival, queue included; then 504
    drain_timeout: float = 10.0  # SIGTERM: how long the running request may still take
    max_body_bytes: int = 1 << 20  # beyond it: 413
    max_tokens_limit: int = 4096  # largest max_tokens a request may ask for (also capped by the cache)
    default_max_tokens: int = 512
    default_temperature: float = 0.0
    api_key_file: str | None = None
    ui: bool = False
    model_names: list[str] = field(default_factory=list)  # first one is the id /v1/models shows
    warmup: bool = True
    parallel: int = 1  # requests generating at once (continuous batching when > 1)
    stall_grace: float = 60.0  # a job older than request_timeout + this means the worker is stuck
    # the request guard (guard.py) and slow-client limits (protocol.py); see docs/server.md "Security"
    allowed_hosts: list[str] = field(default_factory=list)  # Host names besides the bound address and loopback
    cors_origins: list[str] = field(default_factory=list)  # origins other than our own that may call the API
    header_timeout: float = 10.0  # seconds for a request's headers, from its first byte (or the connection)
    body_timeout: float = 30.0  # seconds for a request's body, from its headers; then 408
    max_connections: int = 0  # open connections at most; 0: max(64, 4 x queue size)
    max_connections_per_client: int = 0  # from one address; 0: half of max_connections
    # POST /v1/embeddings: requests waiting while one runs (beyond: 429), and the tokens one request may
    # embed (beyond: 413): 32 texts of all-MiniLM-L6-v2's 256 tokens, or 2,048 short ones. Both share the
    # engine's worker with generation, in slices (slices.py)
    embed_queue_size: int = 2
    embed_max_tokens: int = 8192
    # POST /v1/docs/reload (and SIGHUP): one reload at a time, at most one per this many seconds
    reload_interval: float = 2.0

    def connection_limits(self) -> tuple[int, int]:
        """(total, per client address): one address may take half the slots, leaving the rest to others."""
        total = self.max_connections or max(64, 4 * self.queue_size)
        return total, self.max_connections_per_client or max(1, total // 2)

    def check(self) -> None:
        problems = []
        if not 0 <= self.port <= 65535:
            problems.append(f"port must be 0..65535, got {self.port}")
        if self.queue_size < 0:
            problems.append(f"queue size must be >= 0, got {self.queue_size}")
        if self.embed_queue_size < 0:
            problems.append(f"embeddings queue size must be >= 0, got {self.embed_queue_size}")
        if self.embed_max_tokens < 1:
            problems.append(f"embeddings token budget must be >= 1, got {self.embed_max_tokens}")
        if self.reload_interval < 0:
            problems.append(f"reload interval must be >= 0 seconds, got {self.reload_interval}")
        for name in ("request_timeout", "drain_timeout", "header_timeout", "body_timeout"):
            if getattr(self, name) <= 0:
                problems.append(f"{name.replace('_', ' ')} must be > 0 seconds, got {getattr(self, name)}")
        if isinstance(self.parallel, bool) or not isinstance(self.parallel, int) or not 1 <= self.parallel <= PARALLEL_LIMIT:
            problems.append(f"parallel must be an integer from 1 to {PARALLEL_LIMIT}, got {self.parallel!r}")
        if self.max_connections < 0 or self.max_connections_per_client < 0:
            problems.append("connection limits must be >= 0 (0: the default)")
        from .guard import parse_host

        problems += [f"allowed host must be '*' or host[:port], got {h!r}" for h in self.allowed_hosts
                     if h != "*" and parse_host(h) is None]
        for origin in self.cors_origins:
            if origin != "*" and not origin.startswith(("http://", "https://")):
                problems.append(f"CORS origin must be '*' or start with http:// or https://, got {origin!r}")
        if self.max_body_bytes < 1024:
            problems.append(f"max body bytes must be >= 1024, got {self.max_body_bytes}")
        if self.max_tokens_limit < 1 or self.default_max_tokens < 1:
            problems.append("max tokens limits must be >= 1")
        if not 0.0 <= self.default_temperature <= TEMPERATURE_LIMIT:
            problems.append(f"default temperature must be in [0, {TEMPERATURE_LIMIT:g}], got {self.default_temperature}")
        if problems:
            raise ConfigError("; ".join(problems))


def read_api_key(path: str | None, environ: dict[str, str] | None = None) -> str | None:
    """The bearer token, from `path`, else from systemd's credential directory, else None (no auth).

    Never from argv or the unit file: those are readable by every local user (ps, systemctl show).
    """
    env = os.environ if environ is None else environ
    if not path:
        cred_dir = env.get("CREDENTIALS_DIRECTORY")
        if cred_dir and (Path(cred_dir) / CREDENTIAL_NAME).is_file():
            path = str(Path(cred_dir) / CREDENTIAL_NAME)
        else:
            return None
    p = Path(path)
    try:
        st = p.stat()
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"API key file {p} does not exist") from None
    except (PermissionError, IsADirectoryError, UnicodeDecodeError) as e:
        raise ConfigError(f"API key file {p} cannot be read: {e}") from None
    key = text.strip()
    if not key:
        raise ConfigError(f"API key file {p} is empty")
    if any(c.isspace() for c in key):
        raise ConfigError(f"API key file {p} must hold one token without spaces or newlines")
    if len(key) < 16:
        raise ConfigError(f"API key in {p} is too short ({len(key)} characters; use at least 16)")
    if st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning("API key file %s is readable by other users (chmod 600 it)", p)
    return key
