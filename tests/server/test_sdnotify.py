"""sd_notify against a fake NOTIFY_SOCKET: the exact datagrams systemd would receive."""
from __future__ import annotations

import os
import socket

import pytest

from edgespec.server.sdnotify import Notifier, ping_interval, watchdog_usec


@pytest.fixture
def notify_socket(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    yield str(path), sock
    sock.close()


def test_messages_arrive_as_systemd_expects(notify_socket):
    path, sock = notify_socket
    n = Notifier(environ={"NOTIFY_SOCKET": path})
    assert n.enabled
    assert n.ready("serving m")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving m"
    assert n.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert n.stopping()
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining"
    n.close()


def test_a_newline_cannot_smuggle_another_assignment(notify_socket):
    path, sock = notify_socket
    n = Notifier(environ={"NOTIFY_SOCKET": path})
    n.status("evil\nREADY=1")
    assert sock.recv(4096) == b"STATUS=evil READY=1"


def test_abstract_namespace_socket():
    name = f"edgespec-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2)
    try:
        n = Notifier(environ={"NOTIFY_SOCKET": "@" + name})
        assert n.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"
    finally:
        sock.close()


def test_without_systemd_every_call_is_a_quiet_no_op():
    n = Notifier(environ={})
    assert not n.enabled
    assert n.ready() is False and n.watchdog() is False and n.stopping() is False
    assert n.watchdog_usec is None


def test_a_dead_socket_does_not_raise(tmp_path, caplog):
    n = Notifier(environ={"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert n.watchdog() is False
    assert n.watchdog() is False
    assert sum("sd_notify" in r.message for r in caplog.records) == 1  # warned once, not at every ping


def test_watchdog_period_is_only_for_the_process_it_names():
    assert watchdog_usec({"WATCHDOG_USEC": "3000000"}) == 3_000_000
    assert watchdog_usec({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid())}) == 3_000_000
    assert watchdog_usec({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid() + 1)}) is None
    assert watchdog_usec({"WATCHDOG_USEC": "nope"}) is None
    assert watchdog_usec({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_usec({}) is None


def test_ping_interval_is_a_third_of_the_period():
    assert ping_interval(3_000_000) == pytest.approx(1.0)
    assert ping_interval(None) is None
