"""Starts Debian's Chromium under Playwright for the kiosk tests, never a browser Playwright would
download. Outside CI a missing Chromium or Playwright skips with the reason; in CI (`CI` set) it
fails, because there the browser test is what proves the kiosk works.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest

IN_CI = bool(os.environ.get("CI"))

# The flags a kiosk on a board would use too: no first-run UI, nothing that phones home.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-breakpad",
    "--metrics-recording-only",
    "--password-store=basic",
]


def chromium_path() -> str | None:
    env = os.environ.get("EDGESPEC_CHROMIUM")
    if env:
        return env
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def unavailable(reason: str):
    """Skip outside CI, fail in CI."""
    if IN_CI:
        pytest.fail(f"{reason} (CI runs the kiosk browser test; install it)")
    pytest.skip(reason)


def require_browser() -> str:
    path = chromium_path()
    if not path:
        unavailable("Chromium not found: apt-get install -y chromium (or set EDGESPEC_CHROMIUM)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        unavailable("Python playwright not installed: pip install -e .[test] (never `playwright install`)")
    return path


@contextmanager
def launch(executable: str | None = None, env: dict | None = None):
    """Yields a Playwright Browser running headless Chromium with a fresh profile."""
    from playwright.sync_api import sync_playwright

    exe = executable or require_browser()
    home = tempfile.mkdtemp(prefix="edgespec-kiosk-home-")
    try:
        with sync_playwright() as p:
            # Playwright gives every launch a fresh temporary --user-data-dir of its own; HOME points
            # elsewhere too, so nothing is read from or left in the user's real profile.
            browser = p.chromium.launch(
                executable_path=exe,
                headless=True,
                args=CHROMIUM_ARGS,
                env={**os.environ, "HOME": home, **(env or {})},
            )
            try:
                yield browser
            finally:
                browser.close()
    finally:
        shutil.rmtree(home, ignore_errors=True)


class RequestLog:
    """Every URL the page asks for, to prove nothing goes beyond the server it came from."""

    def __init__(self, page, origin: str):
        self.origin = origin
        self.urls: list[str] = []
        self.console: list[str] = []
        page.on("request", lambda req: self.urls.append(req.url))
        page.on("console", lambda msg: self.console.append(f"{msg.type}: {msg.text}"))
        page.on("pageerror", lambda err: self.console.append(f"pageerror: {err}"))

    def foreign(self) -> list[str]:
        """URLs that are neither the page's origin nor inline data."""
        own = urlsplit(self.origin)
        out = []
        for url in self.urls:
            u = urlsplit(url)
            if u.scheme == "data":
                continue
            if (u.scheme, u.hostname, u.port) != (own.scheme, own.hostname, own.port):
                out.append(url)
        return out

    def errors(self) -> list[str]:
        """Script errors and CSP violations (a connection refused while the server is down is expected)."""
        return [c for c in self.console if c.startswith("pageerror") or "Content Security Policy" in c]


def save_screenshot(page, name: str, also: list[Path] = ()) -> Path:
    """Saves to the test artifacts dir (EDGESPEC_TEST_ARTIFACTS, default /tmp/edgespec-test-artifacts)."""
    root = Path(os.environ.get("EDGESPEC_TEST_ARTIFACTS", Path(tempfile.gettempdir()) / "edgespec-test-artifacts"))
    root.mkdir(parents=True, exist_ok=True)
    path = root / name
    page.screenshot(path=str(path))
    for extra in also:
        extra.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, extra)
    return path
