"""uvicorn's HTTP/1.1 protocol with what a small server facing slow or hostile clients needs:

 * TCP_NODELAY on every connection. The listening socket is made by service.bind_socket; asyncio
   only sets TCP_NODELAY itself on sockets whose `proto` is IPPROTO_TCP, so it is set here. Without
   it a keep-alive request waited ~40 ms: the response goes out in two writes (headers, body), Nagle
   holds the second until the client ACKs the first, and the client delays that ACK.
 * A header timeout: a connection must deliver a request's headers within `header_timeout` seconds of
   connecting (or of its first byte, for the next request on a kept-alive connection); otherwise it is
   answered 408 and closed. The body has its own limit in the endpoint (access.read_body).
 * Connection caps checked when a connection is made: `total` open connections, `per_client` from one
   address, so one client cannot take every slot. A refused connection gets a JSON 503 and is closed.
 * uvicorn's plain-text 400 for a malformed request (no Host header, headers too large, bad syntax)
   becomes the API's JSON error.
"""
from __future__ import annotations

import asyncio
import json
import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def raw_json_response(status: int, reason: str, message: str, code: str, err_type: str = "invalid_request_error") -> bytes:
    body = json.dumps({"error": {"message": message, "type": err_type, "param": None, "code": code}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def make_protocol(header_timeout: float, total: int, per_client: int) -> type:
    """An H11Protocol subclass with these limits (uvicorn takes a class for Config(http=...))."""

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            self._header_timer: asyncio.TimerHandle | None = None
            host = self.client[0] if self.client else None
            same = sum(1 for c in self.connections if c.client and c.client[0] == host) if host else 0
            if len(self.connections) > total:
                self._refuse(f"the server has {total} connections open; retry shortly")
            elif host and same > per_client:
                self._refuse(f"too many connections from {host} ({per_client} at most); reuse a connection")
            else:
                self._arm_header_timer()

        def _refuse(self, message: str) -> None:
            self.transport.write(raw_json_response(503, "Service Unavailable", message, "too_many_connections",
                                                   "service_unavailable"))
            self.transport.close()

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
            super().data_received(data)
            if self.transport.is_closing():
                self._disarm_header_timer()
            elif self.conn.their_state is h11.IDLE:
                self._arm_header_timer()  # headers still incomplete (or the next request has begun)
            else:
                self._disarm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self.transport.write(raw_json_response(
                400, "Bad Request", "malformed HTTP request (bad syntax, headers too large, or no Host header)",
                "invalid_http"))
            self.transport.close()

    return GuardedH11Protocol
