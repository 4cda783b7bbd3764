"""The Hugging Face hub as a model source: plain HTTPS with resume, no hub library (pull runs on boards
without the export extra). Also the one place that says how long to wait for the hub, for `pull` and
for the export alike."""
from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .catalog import HubSource, KnownModel
from .files import SourceFailed, install
from .progress import Progress

HUB_ENDPOINT = "https://huggingface.co"
HUB_TIMEOUT_S = 5.0  # the hub is tried first: when it is not reachable, fail fast


def hub_timeout() -> float:
    """Seconds to wait for the hub before saying it is unreachable (EDGESPEC_HUB_TIMEOUT)."""
    try:
        return float(os.environ.get("EDGESPEC_HUB_TIMEOUT", HUB_TIMEOUT_S))
    except ValueError:
        return HUB_TIMEOUT_S


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT


def hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "EDGESPEC_HUB_OFFLINE"))


def fetch(m: KnownModel, src: HubSource, dest: Path, *, progress: bool) -> None:
    """HTTPS GET of the resolve URL into .<name>.gguf.download, resuming a partial file with a Range
    request. The partial file is kept on failure (the next pull resumes it) and is renamed to the
    final name only after its sha256 checks out."""
    if hub_offline():
        raise SourceFailed("skipped (HF_HUB_OFFLINE is set)")
    url = src.url(hub_endpoint())
    part = dest.parent / f".{dest.name}.download"
    have = part.stat().st_size if part.exists() else 0
    if have > m.size:
        part.unlink()
        have = 0
    headers = {"User-Agent": "edgespec"}
    token = os.environ.get("HF_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if 0 < have < m.size:
        headers["Range"] = f"bytes={have}-"
    timeout = hub_timeout()
    if have < m.size:
        req = urllib.request.Request(url, headers=headers)
        try:
            resp = urllib.request.urlopen(req, timeout=timeout)
        except urllib.error.HTTPError as e:
            if e.code == 416 and have:  # our partial file is already complete (or bogus): check it below
                resp = None
            else:
                raise SourceFailed(f"{url}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            host = urllib.parse.urlsplit(url).hostname
            raise SourceFailed(f"{host} unreachable ({reason})") from None
        if resp is not None:
            with resp:
                if have and resp.status != 206:  # the server ignored the Range header: start over
                    have = 0
                mode = "ab" if have else "wb"
                bar = Progress(f"{m.name}: downloading from the hub", m.size, start=have) if progress else None
                try:
                    with open(part, mode) as out:
                        while True:
                            block = resp.read(1 << 20)
                            if not block:
                                break
                            out.write(block)
                            if bar:
                                bar.advance(len(block))
                except (OSError, urllib.error.URLError, http.client.HTTPException) as e:
                    raise SourceFailed(
                        f"download interrupted after {part.stat().st_size} of {m.size} bytes ({e}); "
                        "the next pull resumes it"
                    ) from None
                finally:
                    if bar:
                        bar.close()
    got = part.stat().st_size
    if got < m.size:
        raise SourceFailed(f"download stopped after {got} of {m.size} bytes; the next pull resumes it")
    install(m, part, dest, progress)
