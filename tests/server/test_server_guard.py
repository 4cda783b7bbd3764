"""The request guard (Host, Origin, Content-Type), slow clients (header and body timeouts, connection
caps), uvicorn's own errors as JSON, and TCP_NODELAY (the keep-alive delay). Against the real stack
with the fake engine; every wait has a deadline that fails loudly, nothing asserts a duration."""
from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed (pip install .[server])")

from edgespec.server.guard import HostPolicy  # noqa: E402
from helpers.wait import wait_for  # noqa: E402
from edgespec.server.service import bind_socket  # noqa: E402
from helpers.fake_server import CHAT, assert_openai_error, chat_body, serve, wait_until  # noqa: E402,F401

BODY = json.dumps(chat_body()).encode()


def raw_post(port, headers: dict, body: bytes = BODY):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("POST", CHAT, skip_host="Host" in headers, skip_accept_encoding=True)
    for k, v in headers.items():
        conn.putheader(k, v)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, resp.headers, json.loads(raw) if raw else None


def read_until_closed(sock: socket.socket, deadline_s: float = 15.0) -> bytes:
    """Everything the server sends until it closes the connection. The socket timeout is a hang
    guard: a server that never closes fails the test here, loudly."""
    sock.settimeout(deadline_s)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
    except socket.timeout:
        pytest.fail(f"the server kept the connection open for {deadline_s:g} s; got {data[:200]!r}")


def json_of(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/json" in head.lower(), head
    return status, json.loads(body)


# --- Host, Origin, Content-Type ---------------------------------------------------------------------
def test_cross_origin_text_plain_post_is_refused(serve):
    s = serve()
    status, _, body = raw_post(s.port, {"Origin": "https://evil.example", "Content-Type": "text/plain"})
    assert assert_openai_error(status, body, 403)["code"] == "origin_not_allowed"
    status, _, body = raw_post(s.port, {"Origin": "https://evil.example", "Content-Type": "application/json"})
    assert status == 403  # the origin alone is enough
    assert s.service.scheduler.depth == 0 and not s.engine.runs  # nothing reached the engine


def test_post_without_json_content_type_is_415(serve):
    s = serve()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        status, _, body = raw_post(s.port, {"Content-Type": ctype})
        assert assert_openai_error(status, body, 415)["code"] == "unsupported_media_type"
    status, _, body = raw_post(s.port, {})  # no Content-Type at all (a fetch() of a Blob)
    assert status == 415
    status, _, body = raw_post(s.port, {"Content-Type": "Application/JSON; charset=utf-8"})
    assert status == 200


def test_foreign_host_is_refused_and_allowed_hosts_admit_names(serve):
    s = serve(allowed_hosts=["kiosk.local"])
    json_ct = {"Content-Type": "application/json"}
    status, _, body = raw_post(s.port, {"Host": f"rebind.evil.example:{s.port}", **json_ct})
    assert assert_openai_error(status, body, 403)["code"] == "host_not_allowed"
    assert s.get("/metrics")[0] == 200
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    conn.request("GET", "/metrics", headers={"Host": "evil.example"})
    assert conn.getresponse().status == 403  # reads are guarded too (a rebinding page could read them)
    conn.close()
    for host in (f"kiosk.local:{s.port}", f"localhost:{s.port}", f"127.0.0.1:{s.port}", "KIOSK.LOCAL"):
        assert raw_post(s.port, {"Host": host, **json_ct})[0] == 200, host


def test_host_policy():
    local = HostPolicy("127.0.0.1", [])
    assert local.allows("127.0.0.1:8000") and local.allows("localhost") and local.allows("[::1]:8000")
    assert not local.allows("192.168.1.9:8000") and not local.allows("evil.example") and not local.allows(None)
    every = HostPolicy("0.0.0.0", ["board.lan"])
    assert every.allows("192.168.1.9:8000") and every.allows("[fe80::1]") and every.allows("board.lan:80")
    assert not every.allows("evil.example:8000")
    assert HostPolicy("127.0.0.1", ["*"]).allows("anything")


def test_same_origin_kiosk_page_works_and_cors_origins_get_headers(serve):
    s = serve(cors_origins=["https://dash.example"])
    own = {"Origin": f"http://127.0.0.1:{s.port}", "Content-Type": "application/json"}
    status, headers, body = raw_post(s.port, own)
    assert status == 200 and "access-control-allow-origin" not in headers
    status, headers, body = raw_post(s.port, {"Origin": "https://dash.example", "Content-Type": "application/json"})
    assert status == 200 and headers["access-control-allow-origin"] == "https://dash.example"
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    conn.request("OPTIONS", CHAT, headers={"Origin": "https://dash.example", "Access-Control-Request-Method": "POST",
                                           "Access-Control-Request-Headers": "content-type, authorization"})
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 204 and "content-type" in resp.headers["access-control-allow-headers"]
    assert resp.headers["access-control-allow-origin"] == "https://dash.example"
    conn.close()
    assert raw_post(s.port, {"Origin": "https://other.example", "Content-Type": "application/json"})[0] == 403


@pytest.mark.parametrize("origin", ["https://127.0.0.1:{port}", "http://127.0.0.1:{other}", "https://127.0.0.1:{other}",
                                    "http://localhost:{port}", "http://127.0.0.1"])
def test_another_scheme_or_port_or_host_is_another_origin(serve, origin):
    s = serve()
    o = origin.format(port=s.port, other=s.port + 1 if s.port < 65535 else s.port - 1)
    status, _, body = raw_post(s.port, {"Origin": o, "Content-Type": "application/json"})
    assert status == 403 and body["error"]["code"] == "origin_not_allowed", (o, body)
    assert raw_post(s.port, {"Origin": f"http://127.0.0.1:{s.port}/", "Content-Type": "application/json"})[0] == 200


def test_origin_key_compares_as_a_browser_does():
    from edgespec.server.guard import origin_key

    assert origin_key("http://127.0.0.1") == origin_key("HTTP://127.0.0.1:80/") == ("http", "127.0.0.1", 80)
    assert origin_key("https://[::1]:8443") == ("https", "::1", 8443)
    assert [origin_key(v) for v in ("null", "ftp://x", "http://x:y", "http://a@b")] == [None] * 4


def test_kiosk_page_and_its_fetches_pass_the_guard(serve):
    s = serve(ui=True)
    assert s.get("/")[0] == 200 and s.get("/app.js")[0] == 200
    origin = f"http://127.0.0.1:{s.port}"
    assert s.get("/ready", headers={"Origin": origin})[0] == 200
    assert raw_post(s.port, {"Origin": origin, "Content-Type": "application/json",
                             "Accept": "text/event-stream"})[0] == 200


# --- uvicorn's own errors, as the API's JSON ------------------------------------------------------
@pytest.mark.parametrize("request_bytes", [
    b"GET /health HTTP/1.1\r\n\r\n",  # no Host
    # headers too large (h11 refuses more than 16 KiB of unfinished headers; all of it is read first,
    # so the server's close is a FIN after the answer, not a reset that would swallow it)
    b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 20_000,
    b"NOT HTTP AT ALL\r\n\r\n",
])
def test_malformed_requests_get_a_json_400(serve, request_bytes):
    s = serve()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    try:
        sock.sendall(request_bytes)
    except OSError:
        pass  # the server may answer and close before the whole header flood is sent
    status, body = json_of(read_until_closed(sock))
    sock.close()
    want = "headers_too_large" if b"X-Big" in request_bytes else "invalid_http"
    assert status == 400 and body["error"]["code"] == want
    assert s.get("/health")[0] == 200


# --- slow clients --------------------------------------------------------------------------------
def test_half_sent_body_is_closed_while_a_real_client_is_served(serve):
    s = serve(body_timeout=1.0, header_timeout=1.0)
    slow = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY[: len(BODY) // 2])
    status, _, ok = s.post(CHAT, chat_body())  # served while the slow one holds its connection
    assert status == 200 and ok["choices"][0]["message"]["content"] == " w0 w1 w2 w3"
    status, body = json_of(read_until_closed(slow))  # then the slow one is answered 408 and closed
    slow.close()
    assert status == 408 and body["error"]["code"] == "body_timeout"


def test_unfinished_headers_are_closed(serve):
    s = serve(header_timeout=1.0)
    idle = socket.create_connection(("127.0.0.1", s.port), timeout=10)  # sends nothing at all
    slow = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
    assert s.post(CHAT, chat_body())[0] == 200
    for sock in (slow, idle):
        status, body = json_of(read_until_closed(sock))
        sock.close()
        assert status == 408 and body["error"]["code"] == "header_timeout"


def _connect_from(addr: str, port: int) -> socket.socket:
    """A client socket from another address of the loopback net (127.0.0.0/8): another client."""
    c = socket.socket()
    c.bind((addr, 0))
    c.connect(("127.0.0.1", port))
    return c


def _closed_by_server(sock: socket.socket, deadline_s: float = 15.0) -> bytes:
    return read_until_closed(sock, deadline_s)


def test_one_address_makes_room_from_its_own_idle_connections(serve):
    """Past the per-address cap, a new connection closes that address's oldest idle one (and not
    another address's): the address can always get a fresh connection, and cannot take more slots."""
    s = serve(max_connections=8, max_connections_per_client=3)
    hogs = [_connect_from("127.0.0.2", s.port) for _ in range(3)]
    other = _connect_from("127.0.0.3", s.port)
    try:
        newest = _connect_from("127.0.0.2", s.port)
        assert _closed_by_server(hogs[0]) == b""  # the oldest silent one, closed without an answer
        newest.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        head = read_until_closed(newest)
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        other.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert read_until_closed(other).startswith(b"HTTP/1.1 200")  # untouched
        assert s.post(CHAT, chat_body())[0] == 200  # 127.0.0.1 still gets in
    finally:
        for c in [*hogs, other]:
            c.close()


def test_a_connection_with_a_request_in_flight_is_never_closed_to_make_room(serve):
    """Only idle connections make room: when every connection of an address has a request in flight,
    the next one from it is refused (503), and the running requests finish."""
    from helpers.fake_server import FakeEngine

    s = serve(FakeEngine(delay=0.05), max_connections=8, max_connections_per_client=2)
    body = json.dumps(chat_body(max_tokens=40)).encode()
    busy = []
    for _ in range(2):
        c = _connect_from("127.0.0.2", s.port)
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        busy.append(c)
    try:
        wait_until(lambda: s.service.scheduler.running is not None and s.service.scheduler.depth == 1,
                   what="one request running and one queued")
        refused = _connect_from("127.0.0.2", s.port)
        status, err = json_of(read_until_closed(refused))
        refused.close()
        assert status == 503 and err["error"]["code"] == "too_many_connections"
        for c in busy:
            status, answer = json_of(read_until_closed(c, 60))
            assert status == 200 and answer["usage"]["completion_tokens"] == 40
    finally:
        for c in busy:
            c.close()


class IdleFlood:
    """`per_address` sockets from each address, connected and silent, reconnected as the server closes
    them (as an attacker keeping the pressure on would), until stopped. Bounded: at most `max_connects`
    connections in all."""

    def __init__(self, port: int, addresses: list[str], per_address: int, max_connects: int = 50_000):
        self.port, self.max_connects = port, max_connects
        self.socks = {a: [] for a in addresses}
        self.connects = self.closed = 0
        for a in addresses:
            for _ in range(per_address):
                self._connect(a)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _connect(self, addr: str) -> None:
        if self.connects < self.max_connects:
            self.socks[addr].append(_connect_from(addr, self.port))
            self.connects += 1

    def _run(self) -> None:
        import select

        while not self._stop.is_set():
            everyone = [c for socks in self.socks.values() for c in socks]
            readable, _, _ = select.select(everyone, [], [], 0.02) if everyone else ([], [], [])
            for c in readable:
                try:
                    gone = c.recv(4096) == b""
                except OSError:
                    gone = True
                if gone:
                    for addr, socks in self.socks.items():
                        if c in socks:
                            socks.remove(c)
                            c.close()
                            self.closed += 1
                            self._connect(addr)

    def stop(self) -> None:
        self._stop.set()
        self._t.join(10)
        for socks in self.socks.values():
            for c in socks:
                c.close()


async def _live(connections) -> int:
    return sum(not c.transport.is_closing() for c in connections)


def test_idle_sockets_from_three_addresses_do_not_starve_a_real_client(serve):
    """99 silent sockets from 127.0.0.2-4 (33 each, reconnecting when closed) against the default
    table (64 connections, 32 per address): a client on 127.0.0.1 is served every time, and the table
    never holds more than its limit. Before the fair table, it got 503 on most tries."""
    s = serve()
    total, per_client = s.service.config.connection_limits()
    assert (total, per_client) == (64, 32)
    flood = IdleFlood(s.port, ["127.0.0.2", "127.0.0.3", "127.0.0.4"], 33)
    try:
        for i in range(10):
            status, _, body = s.post(CHAT, chat_body(max_tokens=2))
            assert status == 200, (i, body)
            assert body["choices"][0]["message"]["content"] == " w0 w1"
        proto = next(iter(s.service.server.server_state.connections)).__class__
        assert proto.evicted["count"] >= 99 - total  # the flood really filled the table
        assert 0 < flood.closed and flood.connects < flood.max_connects  # ... and kept it full to the end
        # counted on the event loop: read from this thread, a connection could be seen between being added to
        # the table and making its room (one over the limit for a moment no client ever sees)
        conns = s.service.server.server_state.connections
        live = asyncio.run_coroutine_threadsafe(_live(conns), s.service.loop).result(timeout=30)
        assert live <= total
    finally:
        flood.stop()


def test_the_kiosk_address_itself_cannot_be_locked_out(serve):
    """40 silent sockets from 127.0.0.1 - the address the kiosk browser uses - over the per-address
    cap (32): the browser's next connection makes room among them instead of getting 503."""
    s = serve()
    flood = IdleFlood(s.port, ["127.0.0.1"], 40)
    try:
        for _ in range(5):
            status, _, _ = s.post(CHAT, chat_body(max_tokens=1), headers={"Origin": f"http://127.0.0.1:{s.port}"})
            assert status == 200
        assert s.get("/ready")[0] == 200
    finally:
        flood.stop()


def test_a_flood_of_idle_sockets_from_the_same_address_never_drops_a_real_request(serve):
    """99 silent sockets from 127.0.0.1 itself, reconnecting as they are closed (the table churns), then
    a real client on the same address: every one of its requests is answered 200. A just-opened
    connection whose request has not been read yet is not idle: before, a few of each hundred requests
    (and most on reruns) had their connection closed with no answer."""
    s = serve()
    flood = IdleFlood(s.port, ["127.0.0.1"], 99)
    try:
        wait_until(lambda: flood.closed >= 50, what="the flood to churn the table", timeout=30)
        failures = []
        for i in range(30):
            try:
                status, _, body = s.post(CHAT, chat_body(max_tokens=1))
                if status != 200:
                    failures.append((i, status, body))
            except (ConnectionError, http.client.HTTPException) as e:  # closed with no answer
                failures.append((i, type(e).__name__))
        assert failures == [], f"{len(failures)} of 30 requests not answered: {failures[:5]}"
        assert flood.connects < flood.max_connects
    finally:
        flood.stop()


def test_silent_sockets_are_closed_within_seconds_under_pressure(serve):
    """Over PRESSURE of the table, a socket that has sent nothing for SILENT_GRACE seconds is closed
    when the next connection arrives, long before the header timeout."""
    s = serve(max_connections=8, max_connections_per_client=8, header_timeout=600)
    early = [_connect_from("127.0.0.2", s.port) for _ in range(3)]
    try:
        import time as _time
        from edgespec.server.protocol import SILENT_GRACE

        _time.sleep(SILENT_GRACE + 0.2)  # (a wait for the grace to pass, not a measurement)
        late = [_connect_from("127.0.0.3", s.port) for _ in range(4)]  # 7 of 8: under pressure
        for c in early:
            assert _closed_by_server(c, 30) == b""
        for c in late:  # younger than the grace: still open
            c.setblocking(False)
            with pytest.raises(BlockingIOError):
                c.recv(1)
            c.close()
    finally:
        for c in early:
            c.close()


# --- keep-alive: TCP_NODELAY ------------------------------------------------------------------------
def test_listening_socket_is_tcp_so_asyncio_sets_nodelay():
    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_every_connection_has_tcp_nodelay(serve):
    """The response is written in two sends (headers, then body). With Nagle on, the second waits for
    the client's ACK of the first, which the client delays (~40 ms): a keep-alive request took 44 ms
    instead of ~1 ms. So every accepted socket must have TCP_NODELAY."""
    s = serve()
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=10)
    for _ in range(3):  # one kept-alive connection, several requests
        conn.request("POST", CHAT, body=BODY, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200 and not resp.will_close
    conns = list(s.service.server.server_state.connections)
    assert conns, "no open connection seen by the server"
    for proto in conns:
        sock = proto.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    conn.close()


# --- Host read strictly, echoed values capped -------------------------------------------------------
def test_host_is_host_and_port_and_nothing_else(serve):
    s = serve()
    ok = {"Content-Type": "application/json"}
    for bad in (f"127.0.0.1:{s.port}@evil.example", f"127.0.0.1:{s.port},evil.example", f"127.0.0.1:{s.port} evil",
                "127.0.0.1:99999", f"127.0.0.1:{s.port}/x", "::1", "[::1", "[127.0.0.1]:80", "user@127.0.0.1"):
        status, _, body = raw_post(s.port, {"Host": bad, **ok})
        assert assert_openai_error(status, body, 400)["code"] == "invalid_host", bad
    # two Host headers: refused as well, by h11 already (which one would a proxy behind us believe?)
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")
    status, body = json_of(read_until_closed(sock))
    sock.close()
    assert status == 400 and body["error"]["code"] in ("invalid_http", "invalid_host")
    for good in (f"127.0.0.1:{s.port}", "127.0.0.1", f"LOCALHOST:{s.port}", f"[::1]:{s.port}", "127.0.0.1:"):
        assert raw_post(s.port, {"Host": good, **ok})[0] == 200, good
    assert len(s.engine.runs) == 5  # only the good ones reached the engine


def test_parse_host():
    from edgespec.server.guard import parse_host

    assert parse_host("Example.COM:8000") == "example.com" and parse_host("[::1]:80") == "::1"
    assert parse_host("board_1.lan") == "board_1.lan" and parse_host("10.0.0.7") == "10.0.0.7"
    for bad in ("a:1@b", "a,b", "a b", "[1.2.3.4]", "[::1]x", "a:65536", "a:1:2", "", "ä.example"):
        assert parse_host(bad) is None, bad


def test_bad_allowed_hosts_option_is_a_config_error():
    from edgespec.server.config import ConfigError, ServerConfig

    with pytest.raises(ConfigError, match=r"allowed host must be '\*' or host\[:port\], got 'a@b'"):
        ServerConfig(allowed_hosts=["kiosk.local", "a@b"]).check()


def test_a_huge_value_is_echoed_capped_in_the_answer_and_the_log(serve, caplog):
    """A 900 KB `model` value (the body limit is 1 MiB) is repeated at most ECHO_LIMIT characters."""
    from edgespec.server.apierror import ECHO_LIMIT

    s = serve(model_names=["fake"])
    caplog.set_level("INFO", logger="edgespec.server.requests")
    huge = "m" * 900_000
    status, _, body = raw_post(s.port, {"Content-Type": "application/json"}, json.dumps(chat_body(model=huge)).encode())
    err = assert_openai_error(status, body, 400, param="model")
    assert err["code"] == "model_not_found"
    assert "m" * ECHO_LIMIT in err["message"] and "… (900000 characters)" in err["message"]
    assert len(err["message"]) < ECHO_LIMIT + 200
    logged = wait_for("the request's log line", lambda: "\n".join(r.getMessage() for r in caplog.records
                                                               if "status=400" in r.getMessage()), timeout=10)
    # (written just after the answer: waited for)
    assert "m" * ECHO_LIMIT in logged and "m" * (ECHO_LIMIT + 1) not in logged
    # a long path and a long Host/Origin: the same cap
    status, _, raw = s.request("GET", "/" + "p" * 10_000)
    assert status == 404 and len(raw) < ECHO_LIMIT + 400
    status, _, body = raw_post(s.port, {"Origin": "https://" + "o" * 5_000, "Content-Type": "application/json"})
    assert status == 403 and len(body["error"]["message"]) < ECHO_LIMIT + 200


def test_echo():
    from edgespec.server.apierror import echo

    assert echo("abc") == "'abc'" and echo("a" * 10, 4) == "'aaaa'… (10 characters)"
    assert echo(12) == "12" and echo([1, 2, 3], 4) == "[1, … (9 characters)"
    assert echo(10 ** 5000) == "<int>"


# --- the kiosk page with an API key; framing ------------------------------------------------------
def _key_file(tmp_path, key="kiosk-key-0123456789abcdef"):
    f = tmp_path / "key"
    f.write_text(key)
    f.chmod(0o600)
    return str(f)


def test_kiosk_page_with_an_api_key_is_admitted_by_its_session_cookie(serve, tmp_path):
    s = serve(ui=True, api_key_file=_key_file(tmp_path))
    origin = {"Origin": f"http://127.0.0.1:{s.port}"}
    status, headers, _ = s.get("/")
    assert status == 200
    cookie = headers["set-cookie"]
    name, _, rest = cookie.partition("=")
    token = rest.split(";")[0]
    assert name == "edgespec_session" and len(token) >= 40
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {a.strip() for a in cookie.split(";")[1:]}
    session = {"Cookie": f"edgespec_session={token}"}
    json_ct = {"Content-Type": "application/json"}
    # the page's own calls: a same-origin POST (Origin sent) and GET (none sent) with the cookie
    assert raw_post(s.port, {**session, **origin, **json_ct})[0] == 200
    assert s.get("/v1/models", headers=session)[0] == 200
    # without it, or with another, or from a --cors-origin site's page: the key is needed
    for headers in ({**origin}, {"Cookie": "edgespec_session=guess", **origin}, {"Cookie": f"other={token}"}):
        status, _, body = raw_post(s.port, {**headers, **json_ct})
        assert assert_openai_error(status, body, 401)["code"] == "invalid_api_key", headers
    assert s.get("/v1/models")[0] == 401 and s.get("/metrics")[0] == 401
    # the key itself still works, cookie or not
    assert raw_post(s.port, {"Authorization": "Bearer kiosk-key-0123456789abcdef", **json_ct})[0] == 200
    assert len(s.engine.runs) == 2


def test_the_session_is_for_the_page_s_own_origin_and_this_process_only(serve, tmp_path):
    s = serve(ui=True, api_key_file=_key_file(tmp_path), cors_origins=["https://dash.example"])
    token = s.get("/")[1]["set-cookie"].split(";")[0].split("=", 1)[1]
    status, _, body = raw_post(s.port, {"Cookie": f"edgespec_session={token}", "Origin": "https://dash.example",
                                        "Content-Type": "application/json"})
    assert status == 401  # an allowed CORS origin still needs the key: the cookie is the kiosk page's alone
    other = serve(ui=True, api_key_file=_key_file(tmp_path))
    assert other.get("/")[1]["set-cookie"].split(";")[0].split("=", 1)[1] != token
    assert other.get("/v1/models", headers={"Cookie": f"edgespec_session={token}"})[0] == 401


def test_no_session_without_a_key_or_for_a_peer_off_the_device(serve, tmp_path):
    from types import SimpleNamespace

    from starlette.datastructures import Headers

    from edgespec.server.access import check_auth, session_cookie
    from edgespec.server.apierror import APIError

    assert "set-cookie" not in serve(ui=True).get("/")[1]  # no key: nothing to stand in for
    state = SimpleNamespace(api_key="k" * 20, session="t" * 43)
    assert session_cookie(state, "192.168.1.9") is None and session_cookie(state, "::1").startswith("edgespec_session=")
    cookie = Headers({"cookie": "edgespec_session=" + "t" * 43, "host": "board.lan:8000"})
    check_auth(state, cookie, "127.0.0.1")
    check_auth(state, cookie, "::ffff:127.0.0.1")
    with pytest.raises(APIError) as e:
        check_auth(state, cookie, "192.168.1.9")  # the right cookie from another machine: the key is needed
    assert e.value.status == 401


def test_every_answer_forbids_framing(serve, tmp_path):
    s = serve(ui=True)
    for path in ("/", "/app.js", "/v1/models", "/ready", "/nope"):
        headers = s.get(path)[1]
        assert headers["content-security-policy"] == "frame-ancestors 'none'", path
        assert headers["x-frame-options"] == "DENY", path
    status, headers, _ = raw_post(s.port, {"Origin": "https://evil.example", "Content-Type": "application/json"})
    assert status == 403 and headers["x-frame-options"] == "DENY"
    status, headers, _ = s.request("POST", CHAT, chat_body(stream=True))
    assert status == 200 and headers["content-security-policy"] == "frame-ancestors 'none'"
