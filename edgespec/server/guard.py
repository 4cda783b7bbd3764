"""The request guard: what keeps a web page from driving the API through a visitor's browser.

Without an API key (the default on 127.0.0.1) the port answers anyone who can reach it. A browser on
the device - the kiosk's own Chromium included - can reach it on behalf of any web page it shows:
 * a cross-origin "simple" request (POST with Content-Type text/plain, no preflight) is sent as is;
 * a DNS-rebinding site makes its own name resolve to 127.0.0.1 and is then "same-origin" to itself.
So every request must pass, in this order (each refusal is an OpenAI-style JSON error):
 0. Host is read strictly: one header, `host[:port]` and nothing else (400 otherwise; none at all,
    which HTTP/1.0 allows, is a 400 too), so no value such as `127.0.0.1:8000@evil.example` can read
    as ours to one check and as another name to whatever reads it next. Origin too: at most one.
 1. Host: the bound address, a loopback name, an IP literal when bound to every interface, or a
    name from --allowed-hosts ("*" turns the check off). Rebinding needs a foreign name: refused (403).
 2. Origin, when the browser sends one: the server's own origin (the kiosk page: the same scheme, host
    and port, as a browser compares them; origin_key), or one listed in --cors-origin ("*": any). Anything else is refused (403); allowed origins get CORS headers and
    their preflights (OPTIONS) answered.
 3. POST bodies must be Content-Type application/json (415): the one type no form or simple
    cross-origin request can send without a preflight.
Clients that are not browsers (curl, the openai package) send no Origin and are not affected, beyond
having to name the JSON they send.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Any

from starlette.datastructures import Headers

from .apierror import APIError, echo
from .responses import error_response

PREFLIGHT_MAX_AGE = "600"
# on every answer: no page of another site may frame the kiosk page (clickjacking) or any other answer
FRAME_HEADERS = [(b"content-security-policy", b"frame-ancestors 'none'"), (b"x-frame-options", b"DENY")]
ALLOWED_HEADERS = "authorization, content-type, accept, x-request-id"


# RFC 9110 Host = uri-host [ ":" port ]; uri-host: an IP-literal in brackets, or a name / IPv4 address
# (letters, digits, '.', '-', '_': what DNS names and addresses use; no userinfo, no lists)
_HOST = re.compile(r"(?:\[(?P<ip6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9._-]+))(?::(?P<port>[0-9]{0,5}))?")


def parse_host(value: str) -> str | None:
    """The host of a Host header value, lower case: 'Example.com:8000' -> 'example.com',
    '[::1]:8000' -> '::1'. None unless the whole value is host[:port]."""
    m = _HOST.fullmatch(value.lower())
    if m is None or (m["port"] and int(m["port"]) > 65535):
        return None
    if m["ip6"] is not None:
        ip = _ip(m["ip6"])
        return m["ip6"] if isinstance(ip, ipaddress.IPv6Address) else None
    return m["name"]


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_key(value: str) -> tuple[str, str, int] | None:
    """An origin as a browser compares it: (scheme, host, port), the scheme's default port filled in:
    'http://127.0.0.1' and 'http://127.0.0.1:80' are one origin, 'https://127.0.0.1:8000' another than
    'http://127.0.0.1:8000', as is 'http://127.0.0.1:8001'. None for 'null' or anything not scheme://host[:port]."""
    scheme, sep, rest = value.strip().rstrip("/").lower().partition("://")
    if not sep or scheme not in _DEFAULT_PORTS:
        return None
    host = parse_host(rest)
    if host is None:
        return None
    port = rest.rpartition(":")[2] if not rest.endswith("]") and ":" in rest.split("]")[-1] else ""
    return scheme, host, int(port) if port else _DEFAULT_PORTS[scheme]


def _is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::")


class HostPolicy:
    """Which Host header values name this server."""

    def __init__(self, bound: str, allowed: list[str]):
        self.bound = bound.strip("[]").lower()
        self.any = "*" in allowed
        self.names = {parse_host(a) or a.lower() for a in allowed if a != "*"}

    def allows(self, host_header: str | None) -> bool:
        if self.any:
            return True
        name = parse_host(host_header) if host_header else None
        if name is None:
            return False  # none, or not host[:port] (the guard answers 400 for that before asking)
        if name in self.names or name == self.bound or name == "localhost":
            return True
        ip = _ip(name)
        if ip is None:
            return False  # a name we were not told about: what DNS rebinding looks like
        # an address literal cannot be rebound; when bound to one address, only that one (and loopback) is ours
        return ip.is_loopback or _is_wildcard(self.bound)


class Guard:
    """ASGI middleware in front of the whole app (see the module docstring)."""

    def __init__(self, app: Any, state: Any):
        self.app = app
        self.state = state
        cfg = state.config
        self.hosts = HostPolicy(cfg.host, list(cfg.allowed_hosts))
        self.origins = {o.rstrip("/").lower() for o in cfg.cors_origins}
        self.origin_keys = {k for k in map(origin_key, self.origins) if k is not None}
        self.any_origin = "*" in self.origins

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        extra = list(FRAME_HEADERS)

        async def send_with(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        try:
            cors = self.check(scope, headers)
        except APIError as e:
            self.state.metrics.observe_request("refused", e.status, 0.0)
            await error_response(e)(scope, receive, send_with)
            return
        if cors is None:
            await self.app(scope, receive, send_with)
            return
        if scope["method"] == "OPTIONS":  # a preflight from an allowed origin
            await _preflight(cors)(scope, receive, send_with)
            return
        extra += _cors_headers(cors)
        await self.app(scope, receive, send_with)

    def check(self, scope: dict, headers: Headers) -> str | None:
        """Raises the refusal, or returns the origin to answer with CORS headers (None: no CORS)."""
        hosts = headers.getlist("host")
        host = hosts[0] if hosts else None
        if len(hosts) > 1 or (host is not None and parse_host(host) is None):
            raise APIError(400, f"Host header {echo(', '.join(hosts))} is not one host[:port]", code="invalid_host")
        if host is None and not self.hosts.any:  # HTTP/1.0 may leave it out (h11 refuses HTTP/1.1 without one)
            raise APIError(400, "the request has no Host header (send one: which server is it for?)",
                           code="invalid_host")
        if not self.hosts.allows(host):
            raise APIError(403, f"Host {echo(host or '')} is not a name of this server; add it with "
                                "--allowed-hosts if clients really use it", code="host_not_allowed")
        origins = headers.getlist("origin")
        if len(origins) > 1:  # which one would the browser, a proxy, or the next check believe?
            raise APIError(400, f"{len(origins)} Origin headers: a request has one origin", code="invalid_origin")
        origin = origins[0] if origins else None
        cors = None
        if origin is not None:
            o = origin.rstrip("/").lower()
            own = origin_key(f"{scope.get('scheme', 'http')}://{host}") if host else None
            same = own is not None and origin_key(o) == own
            if not same:
                if not (self.any_origin or o in self.origins or origin_key(o) in self.origin_keys):
                    raise APIError(403, f"cross-origin request from {echo(origin)} refused; allow the origin "
                                        "with --cors-origin", code="origin_not_allowed")
                cors = origin
        if scope["method"] == "POST":
            ctype = headers.get("content-type", "")
            if ctype.split(";", 1)[0].strip().lower() != "application/json":
                raise APIError(415, f"Content-Type must be application/json, got {echo(ctype, 60)} "
                                    "(curl: -H 'Content-Type: application/json')", code="unsupported_media_type")
        return cors


def _cors_headers(origin: str) -> list[tuple[bytes, bytes]]:
    return [(b"access-control-allow-origin", origin.encode("latin-1", "replace")),
            (b"vary", b"Origin"),
            (b"access-control-expose-headers", b"x-request-id")]


def _preflight(origin: str):
    from starlette.responses import Response

    resp = Response(status_code=204, headers={
        "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
        "Access-Control-Allow-Headers": ALLOWED_HEADERS,
        "Access-Control-Max-Age": PREFLIGHT_MAX_AGE,
    })
    resp.raw_headers.extend(_cors_headers(origin))
    return resp
