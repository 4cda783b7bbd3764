"""One running `edgespec serve` in this process, with the real `openai` package as its client, on a
tiny bundle: one Engine with `parallel` slots (1: requests queue; N: they generate together)."""
from __future__ import annotations

import signal
import threading
from pathlib import Path

from edgespec.server.config import ServerConfig
from edgespec.server.sdnotify import Notifier
from edgespec.server.service import Hooks, Service

from .wait import wait_for

DEADLINE = 60.0  # seconds: a hang guard for start, requests and stop, never a measurement


class RunningServer:
    def __init__(self, bundle: Path, *, parallel: int = 1, token_delay: float = 0.0, max_len: int = 256,
                 engine: dict | None = None, **cfg):
        """engine: more engine options (Settings fields), as `serve`'s flags give them."""
        import openai

        from edgespec.engine import Engine

        cfg.setdefault("port", 0)
        self.bundle = bundle

        def open_engine():
            return Engine.open(bundle, **{"max_len": max_len, "verify": False, **(engine or {}), "parallel": parallel})

        self.service = Service(ServerConfig(parallel=parallel, **cfg), open_engine, default_name=bundle.name,
                               notifier=Notifier(environ={}), hooks=Hooks(token_delay=token_delay))
        self.thread = threading.Thread(target=self.service.run, daemon=True)
        self.thread.start()
        wait_for("the server to be ready", self._ready, timeout=DEADLINE, every=0.02)
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{self.service.port}/v1", api_key="unused",
                                    max_retries=0, timeout=DEADLINE)

    def _ready(self) -> bool:
        state = self.service.state
        assert state.phase in ("loading", "ready"), f"the server did not start: {state.failure}"
        return state.phase == "ready"

    def stop(self) -> None:
        self.service.on_signal(signal.SIGTERM)
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive()


def together(calls):
    """Runs each call in its own thread, all released at once by a barrier (several clients at the same
    moment); returns their results in order. A call still running at DEADLINE fails the test."""
    results: dict[int, object] = {}
    barrier = threading.Barrier(len(calls))

    def run(i):
        barrier.wait(DEADLINE)
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    assert len(results) == len(calls), f"{len(calls) - len(results)} of {len(calls)} calls did not finish"
    return [results[i] for i in range(len(calls))]
