"""Quick checks of the kiosk page's files, no browser: everything it needs ships in the package and
nothing points outside it (the kiosk has no network), and the script parses."""
from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

import edgespec

STATIC = Path(edgespec.__file__).parent / "static"
REPO = Path(__file__).resolve().parents[2]


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.meta: dict[str, str] = {}
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href", "action", "poster", "data"):
            if a.get(key):
                self.refs.append((tag, key, a[key]))
        if tag == "meta" and a.get("http-equiv"):
            self.meta[a["http-equiv"].lower()] = a.get("content", "")
        if a.get("id"):
            self.ids.add(a["id"])


def parse_index() -> _Refs:
    p = _Refs()
    p.feed((STATIC / "index.html").read_text(encoding="utf-8"))
    return p


def test_every_reference_is_a_file_in_the_package():
    refs = parse_index().refs
    assert refs, "index.html references nothing?"
    local = []
    for tag, attr, value in refs:
        if value.startswith("data:"):
            continue
        assert not re.match(r"^[a-z][a-z0-9+.-]*:|^//|^/", value, re.I), (
            f"<{tag} {attr}={value!r}> leaves the page's folder; the kiosk must work without a network")
        assert (STATIC / value).is_file(), f"<{tag} {attr}={value!r}> names a file that is not in edgespec/static"
        local.append(value)
    assert {"app.js", "style.css"} <= set(local)


def test_no_external_urls_fonts_or_imports_anywhere():
    for f in STATIC.iterdir():
        if f.suffix not in (".html", ".js", ".css"):
            continue
        text = f.read_text(encoding="utf-8")
        assert not re.search(r"https?://", text), f"{f.name} mentions an http(s) URL"
        assert not re.search(r"""["'(]\s*//[\w.-]+\.\w""", text), f"{f.name} has a protocol-relative URL"
        if f.suffix == ".css":
            assert "@import" not in text and "@font-face" not in text, f"{f.name} loads fonts or other sheets"
            for url in re.findall(r"url\(\s*['\"]?([^'\")]+)", text):
                assert url.startswith("data:"), f"{f.name} loads {url}"
        if f.suffix == ".js":
            # only the page's own API, by absolute path on the same origin
            for url in re.findall(r"fetch\(\s*[\"'`]([^\"'`]+)", text):
                assert url.startswith("/") and not url.startswith("//"), f"app.js fetches {url}"


def test_content_security_policy_forbids_other_origins():
    csp = parse_index().meta.get("content-security-policy", "")
    directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
    assert directives.get("default-src") == ["'none'"]
    for name in ("script-src", "style-src", "connect-src"):
        assert directives.get(name) == ["'self'"], (name, csp)


def test_the_elements_the_script_uses_exist():
    ids = parse_index().ids
    used = set(re.findall(r'\$\("([\w-]+)"\)', (STATIC / "app.js").read_text(encoding="utf-8")))
    assert used, "app.js looks up no elements?"
    assert used <= ids, f"app.js uses ids missing from index.html: {sorted(used - ids)}"


def test_accessibility_landmarks():
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    assert re.search(r'<main[^>]*role="log"[^>]*aria-live="polite"', html)
    assert re.search(r'<label for="input"', html)
    assert re.search(r'<html lang="\w+"', html)
    assert 'name="viewport"' in html


def test_script_parses():
    node = shutil.which("node")
    if not node:
        pytest.skip("node not installed; the browser tests still load the script")
    r = subprocess.run([node, "--check", str(STATIC / "app.js")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_static_files_are_package_data():
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["edgespec"]
    assert "static/*" in patterns
    # flat folder: "static/*" does not reach into subfolders
    assert all(p.is_file() for p in STATIC.iterdir() if not p.name.startswith(".")), "static/ must stay flat"


def test_api_calls_renew_the_session_once_on_401():
    """With an API key the server admits the page by a session cookie that serving the page sets; after
    a server restart the old cookie gets 401, and the page must renew it (by asking for itself) and
    retry, once - a second 401 is real and shown. Runs the page's apiFetch in node with a stub fetch."""
    node = shutil.which("node")
    if not node:
        pytest.skip("node not installed; the browser tests still load the script")
    text = (STATIC / "app.js").read_text(encoding="utf-8")
    assert not re.findall(r"(?<![\w.])fetch\(\s*[\"'`]/v1/", text), "an API call bypasses apiFetch"
    fn = re.search(r"  async function apiFetch\(url, init\) \{\n.*?\n  \}\n", text, re.S)
    assert fn, "apiFetch not found in app.js"
    harness = fn.group(0) + """
const cases = JSON.parse(process.argv[1]);
(async () => {
  const out = [];
  for (const statuses of cases) {
    const calls = [];
    globalThis.fetch = async (url, init) => {
      calls.push(url);
      return { status: url === "/" ? 200 : statuses.shift() };
    };
    const res = await apiFetch("/v1/chat/completions", { method: "POST", body: "{}" });
    out.push({ status: res.status, calls });
  }
  console.log(JSON.stringify(out));
})();
"""
    import json

    r = subprocess.run([node, "-e", harness, json.dumps([[200], [401, 200], [401, 401]])],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    ok, renewed, refused = json.loads(r.stdout)
    api = "/v1/chat/completions"
    assert ok == {"status": 200, "calls": [api]}
    assert renewed == {"status": 200, "calls": [api, "/", api]}
    assert refused == {"status": 401, "calls": [api, "/", api]}
