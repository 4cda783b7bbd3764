"""uvicorn's HTTP/1.1 protocol with what a small server facing slow or hostile clients needs:

 * TCP_NODELAY on every connection. The listening socket is made by service.bind_socket; asyncio
   only sets TCP_NODELAY itself on sockets whose `proto` is IPPROTO_TCP, so it is set here. Without
   it a keep-alive request waited ~40 ms: the response goes out in two writes (headers, body), Nagle
   holds the second until the client ACKs the first, and the client delays that ACK.
 * A header timeout: a connection must deliver a request's headers within `header_timeout` seconds of
   connecting (or of its first byte, for the next request on a kept-alive connection); otherwise it is
   answered 408 and closed. The body has its own limit in the endpoint (access.read_body).
 * A fair connection table, checked when a connection is made: at most `total` open connections and
   `per_client` from one address. A connection beyond either limit makes room by closing an *idle*
   one (no request in flight) - the address's own for the per-address limit - instead of being
   refused, so sockets held open without a request cannot starve a client that has one to send. A
   connection whose socket holds bytes the event loop has not read yet is not idle (its request is
   there, waiting for the loop's turn): under a flood that churns the table, a just-opened connection
   was otherwise closed with its request unread.
   Order: sockets that never sent a byte, oldest first; then kept-alive ones between requests, the
   longest idle first; then ones still sending their headers. Only when every connection in the way
   has a request in flight is the new one refused (a JSON 503). While the table is more than
   PRESSURE full, sockets that have sent nothing for SILENT_GRACE seconds are closed at once.
 * A total header budget (MAX_HEADER_BYTES): the request line and every header counted together,
   however they arrive. h11 refuses 16 KiB of *unfinished* headers, but headers that arrive whole in
   one read (one 20,000-byte header, three of 8 KB, 5,000 small ones) were parsed and served; here the
   parsed request is measured before it reaches the app.
 * uvicorn's plain-text 400 for a malformed request (no Host header, headers too large, bad syntax)
   becomes the API's JSON error.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("edgespec.server")

SILENT_GRACE = 2.0  # seconds a socket may stay silent while the table is under pressure
PRESSURE = 0.75  # fraction of the table in use from which silent sockets get SILENT_GRACE only
EVICTION_LOG_EVERY = 10.0  # seconds between the warnings that idle connections are being closed

MAX_HEADER_BYTES = 16 << 10  # request line and headers of one request (docs/server.md); h11's own default too
# each header line's bytes beyond its name and value (": " and CRLF), and the request line's ("GET  HTTP/1.1\r\n")
HEADER_LINE_OVERHEAD, REQUEST_LINE_OVERHEAD = 4, 12
TOO_LARGE = "request line and headers over MAX_HEADER_BYTES"

# eviction classes: lower goes first
SILENT, KEPT_ALIVE, SENDING = 0, 1, 2


def raw_json_response(status: int, reason: str, message: str, code: str, err_type: str = "invalid_request_error") -> bytes:
    body = json.dumps({"error": {"message": message, "type": err_type, "param": None, "code": code}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def make_protocol(header_timeout: float, total: int, per_client: int) -> type:
    """An H11Protocol subclass with these limits (uvicorn takes a class for Config(http=...))."""
    silent_grace = min(SILENT_GRACE, header_timeout)
    evictions = {"count": 0, "logged": 0, "last_log": -EVICTION_LOG_EVERY}  # shared by every connection

    class GuardedH11Protocol(H11Protocol):
        evicted = evictions  # for the tests and the log

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            self._header_timer: asyncio.TimerHandle | None = None
            self._made = self._active = time.monotonic()
            self._spoke = False  # any byte received on this connection
            self._sending = False  # bytes of a request whose headers are not complete yet
            self._measure_requests()
            if self._make_room():
                self._arm_header_timer()

        # -- the connection table -----------------------------------------------------------------
        def _open(self) -> list["GuardedH11Protocol"]:
            return [c for c in self.connections if c is not self and isinstance(c, GuardedH11Protocol)
                    and not c.transport.is_closing()]

        def _idle_rank(self) -> tuple[int, float] | None:
            """(class, since) when closing this connection loses no request; None while one is in flight,
            or waits unread (bytes in the socket that the event loop has not had its turn to read: a
            just-opened connection's request, or a kept-alive one's next)."""
            if self.transport.is_closing():
                return None
            if self.cycle is not None and not self.cycle.response_complete:
                return None
            if not self._sending and self._unread():
                return None
            if not self._spoke:
                return (SILENT, self._made)
            return (SENDING if self._sending else KEPT_ALIVE, self._active)

        def _unread(self) -> bool:
            """Bytes wait in this connection's socket (peeked, not taken: the loop reads them next)."""
            sock = self.transport.get_extra_info("socket")  # asyncio's wrapper, which has no recv
            if sock is None or sock.fileno() < 0:
                return False
            peek = socket.socket(sock.family, sock.type, fileno=sock.fileno())
            try:
                return bool(peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
            except OSError:  # nothing there (EAGAIN), or reset by the peer: nothing to lose by closing it
                return False
            finally:
                peek.detach()  # the descriptor stays the transport's

        def _make_room(self) -> bool:
            """Applies the limits to this new connection; False when it was refused."""
            others = self._open()
            now = time.monotonic()
            if len(others) + 1 > total * PRESSURE:
                for c in others:
                    if not c._spoke and now - c._made >= silent_grace:
                        c._evict()
                others = self._open()
            host = self.client[0] if self.client else None
            if host:
                same = [c for c in others if c.client and c.client[0] == host]
                if len(same) + 1 > per_client and not self._evict_one(same):
                    self._refuse(f"too many connections from {host} with a request in flight "
                                 f"({per_client} at most); retry shortly")
                    return False
                others = self._open()
            if len(others) + 1 > total and not self._evict_one(others):
                self._refuse(f"the server has {total} connections with a request in flight; retry shortly")
                return False
            return True

        def _evict_one(self, candidates: list["GuardedH11Protocol"]) -> bool:
            ranked = [(r, i) for i, c in enumerate(candidates) if (r := c._idle_rank()) is not None]
            if not ranked:
                return False
            candidates[min(ranked)[1]]._evict()
            return True

        def _evict(self) -> None:
            """Closes an idle connection to make room (no answer: it has no request to answer)."""
            self._disarm_header_timer()
            self._unset_keepalive_if_required()
            evictions["count"] += 1
            now = time.monotonic()
            if now - evictions["last_log"] >= EVICTION_LOG_EVERY:
                log.warning("connection table full: closed %d idle connection(s) to make room (latest from %s)",
                            evictions["count"] - evictions["logged"], self.client[0] if self.client else "?")
                evictions["logged"], evictions["last_log"] = evictions["count"], now
            self.transport.close()

        def _refuse(self, message: str) -> None:
            self.transport.write(raw_json_response(503, "Service Unavailable", message, "too_many_connections",
                                                   "service_unavailable"))
            self.transport.close()

        # -- the header budget --------------------------------------------------------------------
        def _measure_requests(self) -> None:
            """Every request h11 parses is measured before uvicorn hands it to the app: over the budget
            it is h11's own RemoteProtocolError, which uvicorn answers with send_400_response."""
            parse = self.conn.next_event
            self._too_large = False

            def next_event():
                try:
                    event = parse()
                except h11.RemoteProtocolError as e:  # 431: h11's own limit on unfinished headers
                    self._too_large = e.error_status_hint == 431
                    raise
                if isinstance(event, h11.Request) and header_bytes(event) > MAX_HEADER_BYTES:
                    self._too_large = True
                    raise h11.RemoteProtocolError(TOO_LARGE, error_status_hint=431)
                return event

            self.conn.next_event = next_event

        # -- the header timeout -------------------------------------------------------------------
        def _arm_header_timer(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout, self._headers_timed_out)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_timed_out(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.our_state is h11.IDLE:  # nothing sent on this cycle: we may still answer
                self.transport.write(raw_json_response(408, "Request Timeout", f"the request headers did not arrive "
                                                       f"within {header_timeout:g} s", "header_timeout"))
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            self._spoke = True
            self._active = time.monotonic()
            super().data_received(data)
            self._sending = self.conn.their_state is h11.IDLE and bool(data)
            if self.transport.is_closing():
                self._disarm_header_timer()
            elif self.conn.their_state is h11.IDLE:
                self._arm_header_timer()  # headers still incomplete (or the next request has begun)
            else:
                self._disarm_header_timer()

        def on_response_complete(self) -> None:
            self._active = time.monotonic()
            self._sending = False
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            if getattr(self, "_too_large", False):  # (uvicorn passes its own generic msg)
                body = (f"the request line and headers are over {MAX_HEADER_BYTES // 1024} KiB", "headers_too_large")
            else:
                body = ("malformed HTTP request (bad syntax, headers too large, or no Host header)", "invalid_http")
            self.transport.write(raw_json_response(400, "Bad Request", *body))
            self.transport.close()

    return GuardedH11Protocol


def header_bytes(request: "h11.Request") -> int:
    """The size of a parsed request's request line and headers, as sent (h11 keeps names and values)."""
    line = len(request.method) + len(request.target) + REQUEST_LINE_OVERHEAD
    return line + sum(len(name) + len(value) + HEADER_LINE_OVERHEAD for name, value in request.headers)
