"""The server process: listen first, load the engine in the background, tell systemd when it is
really ready, keep the watchdog fed while the serving loop is alive, and drain on SIGTERM.

Life of the process:
  bind the socket (a port clash fails at once)  ->  HTTP up: /health 200, /ready 503 "loading"
  -> Engine.open + a short warm-up generation (a visitor's, with a pinned system prompt; the
     loop's worker thread started meanwhile)  ->  READY=1, /ready 200
  -> WATCHDOG=1 every third of WatchdogSec from the event loop, only while the worker is not stuck
  -> SIGTERM/SIGINT: STOPPING=1, stop accepting, 503 to queued requests, the running ones may finish
     within --drain-timeout and are cancelled after it, then exit 0. A second one cancels the running
     requests at once; its stream still ends with an error event and [DONE] (FORCE_GRACE).
  SIGHUP re-reads the API key from where it was read at start (a bad file keeps the old key);
  SIGUSR1 and SIGUSR2 are logged and ignored. Their default action would end the process where it
  stands, cutting every stream without an error event.

Test hooks (only with EDGESPEC_TEST_HOOKS=1 in the environment, for the systemd and drain tests):
  EDGESPEC_TEST_READY_DELAY=S  wait S seconds after the warm-up before READY=1
  EDGESPEC_TEST_TOKEN_DELAY=S  sleep S seconds after each engine round (a slow engine)
  SIGUSR2                      block the event loop for good (a hung serving loop: the watchdog fires)
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import EdgespecError, InvalidRequest
from .app import create_app
from .generation import ANSWER_GRACE
from .state import ServerState
from .config import ConfigError, ServerConfig, read_api_key
from .scheduler import SHUTDOWN, Scheduler
from .sdnotify import Notifier, ping_interval

log = logging.getLogger("edgespec.server")

STATUS_EVERY = 10.0  # seconds between STATUS= updates for `systemctl status`
FORCE_GRACE = 2.0  # second SIGTERM: seconds the cancelled streams get to send their error event and [DONE]
SHUTDOWN_GRACE = 5.0  # after the drain deadline: seconds before uvicorn cancels what still runs


@dataclass
class Hooks:
    enabled: bool = False
    ready_delay: float = 0.0
    token_delay: float = 0.0

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Hooks":
        env = os.environ if environ is None else environ
        if env.get("EDGESPEC_TEST_HOOKS") != "1":
            return cls()
        return cls(True, float(env.get("EDGESPEC_TEST_READY_DELAY", 0) or 0),
                   float(env.get("EDGESPEC_TEST_TOKEN_DELAY", 0) or 0))


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only when it sees it
    # (protocol.py sets it again on each connection; see there why it matters)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        hint = " (another server is using it: stop it or choose --port)" if e.errno == 98 else ""
        raise EdgespecError(f"cannot listen on {host}:{port}: {e.strerror}{hint}") from None
    sock.listen(128)
    return sock


def warm_up(engine: Any) -> None:
    """One tiny generation through the whole request path (tokenizer, chat template, prefill,
    decode), so READY=1 means "answers at full speed". Engine.open has already run every step size
    once; this covers what it does not.

    With a pinned system prompt (`--system-prompt`) the warm-up is a visitor's conversation: it
    starts with that prompt, so the target cache holds the prompt's rows at READY and the first
    visitor reuses them exactly as the second does. A warm-up that shares nothing with the prompt
    overwrote them: on the CPU provider the first visitor then paid the copy back (11-14 ms for 923
    tokens, measured), and on a GPU provider, where no copy is kept, the whole prompt's prefill."""
    pin = engine.pinned
    if pin is not None:
        engine.generate(**pin.request("Hi"), max_new_tokens=2)
        return
    try:
        engine.generate(messages=[{"role": "user", "content": "Hi"}], max_new_tokens=2)
    except InvalidRequest:  # a bundle without a chat template
        engine.generate(prompt="Hi", max_new_tokens=2)


async def prime_thread_pool() -> None:
    """Starts the event loop's worker thread now. The first `run_in_threadpool` of a loop pays
    anyio's one-off set-up (measured on the dev CPU: 29 ms, then 0.2-0.4 ms a call), and the first
    request counts its tokens there: primed while the model loads, the first visitor does not pay it."""
    from starlette.concurrency import run_in_threadpool

    await run_in_threadpool(lambda: None)


class _Uvicorn:
    """uvicorn.Server whose signal handler drains first; built lazily so importing this module stays cheap."""

    @staticmethod
    def make(config: Any, on_signal: Callable[[int], None]) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: Any) -> None:
                # not super(): uvicorn would re-raise the signal after shutdown and we would die by
                # SIGTERM instead of exiting 0 after a clean drain
                on_signal(sig)

        return Server(config)


class Service:
    def __init__(self, config: ServerConfig, open_engine: Callable[[], Any], *, default_name: str,
                 notifier: Notifier | None = None, hooks: Hooks | None = None):
        config.check()
        self.config = config
        self.open_engine = open_engine
        self.notifier = notifier or Notifier()
        self.hooks = hooks or Hooks.from_env()
        api_key = read_api_key(config.api_key_file)
        self.scheduler = Scheduler(config.queue_size, token_delay=self.hooks.token_delay,
                                   embed_queue=config.embed_queue_size)
        self.state = ServerState(config, self.scheduler, default_name=default_name, api_key=api_key)
        if config.ui and "/" not in self.state.static:
            raise ConfigError("--ui: the kiosk page is not installed (edgespec/static/index.html is missing)")
        if config.ui and api_key:
            log.info("--ui with an API key: the page admits the browser on this device by a session cookie; "
                     "every other client needs the key (docs/kiosk.md)")
        if not _is_loopback(config.host) and not api_key:
            log.warning("listening on %s without an API key: anyone who can reach this port can use the model "
                        "(set --api-key-file)", config.host)
        self.sock = bind_socket(config.host, config.port)
        self.port = self.sock.getsockname()[1]
        self.exit_error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: Any = None
        self._loader: threading.Thread | None = None
        self._t0 = time.monotonic()

    # -- the event loop ---------------------------------------------------------------------------
    def run(self) -> int:
        """Serves until SIGTERM/SIGINT; 0 after a clean drain. A load failure is raised again here."""
        import uvicorn

        from .protocol import make_protocol

        total, per_client = self.config.connection_limits()
        uv_config = uvicorn.Config(
            create_app(self.state), lifespan="off", log_config=None, access_log=False, use_colors=False,
            server_header=False, loop="asyncio", timeout_keep_alive=5,
            # header timeout, connection caps (a JSON 503 beyond them), TCP_NODELAY, JSON 400s
            http=make_protocol(self.config.header_timeout, total, per_client),
            # uvicorn's own plain 503, a backstop behind protocol.py's table (connections it closed to make
            # room stay counted here until their close completes, hence the margin)
            limit_concurrency=2 * total + 1,
            timeout_graceful_shutdown=int(self.config.drain_timeout + SHUTDOWN_GRACE),
        )
        self.server = _Uvicorn.make(uv_config, self.on_signal)
        previous = self._catch_other_signals()
        try:
            asyncio.run(self._main())
        finally:
            self.sock.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if self.exit_error is not None:
            raise self.exit_error
        if self._loader is not None and self._loader.is_alive():
            # stopped while onnxruntime was still building sessions: a normal interpreter exit could
            # crash inside that thread; leave at once, nothing is half-written by loading
            log.info("stopped during loading")
            logging.shutdown()
            os._exit(0)
        return 0

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.notifier.status("loading the model")
        log.info("listening on http://%s:%d (model loading; /ready answers 200 once it is served)",
                 _url_host(self.config.host), self.port)
        self._loader = threading.Thread(target=self._load, name="edgespec-load", daemon=True)
        self._loader.start()
        await prime_thread_pool()
        beat = asyncio.create_task(self._heartbeat())
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            beat.cancel()
            if not self.scheduler.stop(timeout=5.0):
                log.warning("the worker did not stop within 5 s")
            engine = self.state.engine
            if engine is not None:
                try:
                    engine.close()
                except Exception:  # noqa: BLE001 - closing must not turn a clean stop into a crash
                    log.exception("closing the engine failed")
            self.notifier.status("stopped")

    def _load(self) -> None:
        try:
            engine = self.open_engine()
            if self.config.warmup:
                self.notifier.status("warming up")
                warm_up(engine)
            if self.hooks.ready_delay:
                time.sleep(self.hooks.ready_delay)
        except BaseException as e:  # noqa: BLE001 - reported to the loop, which stops the server
            self._call_in_loop(self._load_failed, e)
            return
        self._call_in_loop(self._loaded, engine)

    def _call_in_loop(self, fn: Callable, *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed: we were stopped while loading
            pass

    def _loaded(self, engine: Any) -> None:
        if self.state.phase != "loading":  # a SIGTERM arrived during the load
            engine.close()
            return
        self.state.set_engine(engine)
        self.scheduler.start(engine)
        self.state.phase = "ready"
        where = f"http://{_url_host(self.config.host)}:{self.port}"
        log.info("ready: serving %r on %s (loaded and warmed up in %.1f s, cache %d tokens, queue %d)",
                 self.state.model_id, where, time.monotonic() - self._t0, engine.max_len, self.config.queue_size)
        self.notifier.ready(f"serving {self.state.model_id} on {where}")

    def _load_failed(self, e: BaseException) -> None:
        self.state.phase = "failed"
        self.state.failure = str(e)
        self.exit_error = e
        if not isinstance(e, EdgespecError):
            log.error("loading the model failed", exc_info=e)
        self.notifier.status(f"failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        self.server.should_exit = True

    async def _heartbeat(self) -> None:
        """WATCHDOG=1 from the serving loop itself: if the loop hangs, the pings stop and systemd
        restarts us. A worker stuck inside one pass for longer than any request may run also stops
        them, because cancellation cannot reach it there."""
        interval = ping_interval(self.notifier.watchdog_usec)
        stall = self.config.request_timeout + ANSWER_GRACE + self.config.stall_grace
        warned = False
        last_status = 0.0
        while True:
            if interval is not None:
                if self.scheduler.healthy(stall):
                    self.notifier.watchdog()
                    warned = False
                elif not warned:
                    log.error("the worker has been stuck on one request for over %.0f s: no longer feeding the "
                              "watchdog, systemd will restart the service", stall)
                    warned = True
            now = time.monotonic()
            if self.state.phase == "ready" and self.notifier.enabled and now - last_status >= STATUS_EVERY:
                self.notifier.status(self._status_line())
                last_status = now
            await asyncio.sleep(interval if interval is not None else STATUS_EVERY)

    def _status_line(self) -> str:
        m = self.state.metrics
        n = sum(m.requests[k] for k in m.requests if k[0] in ("chat", "completions"))
        parts = [f"serving {self.state.model_id}", f"{n} requests", f"queue {self.scheduler.depth}"]
        if m.last_tokens_per_second is not None:
            parts.append(f"last {m.last_tokens_per_second:.1f} tok/s")
        if m.drafted:
            parts.append(f"acceptance {m.accepted / m.drafted:.0%}")
        return ", ".join(parts)

    # -- stopping ---------------------------------------------------------------------------------
    def on_signal(self, sig: int) -> None:
        """A signal received (the handler), or sent by an embedding program to stop the service: hand the work to the
        loop."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._drain, sig)
        else:
            self.server.should_exit = True

    def _drain(self, sig: int) -> None:
        name = _signal_name(sig)
        if self.state.phase == "draining":  # a second signal: stop now
            log.warning("%s again: cancelling the running requests now", name)
            running = self.scheduler.running
            if running is None:
                self.server.force_exit = True
                return
            running.cancel(SHUTDOWN)  # the worker stops at its next pass; the stream sends its error and [DONE]
            self.loop.call_later(FORCE_GRACE, setattr, self.server, "force_exit", True)
            return
        self.notifier.stopping()
        self.state.phase = "draining"
        running = self.scheduler.drain()
        if running is not None:
            log.info("%s: draining; the running requests %s may finish within %.0f s", name, running.id,
                     self.config.drain_timeout)
            self.loop.call_later(self.config.drain_timeout, running.cancel, SHUTDOWN)
        else:
            log.info("%s: stopping", name)
        self.server.should_exit = True

    # -- the other signals --------------------------------------------------------------------------
    def _catch_other_signals(self) -> dict[int, Any]:
        """SIGHUP, SIGUSR1, SIGUSR2 handled for the whole run (main thread only: the tests that run the
        server in a thread call reload_api_key directly). Returns the handlers to put back."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            previous[sig] = signal.signal(sig, self._on_other_signal)
        return previous

    def _on_other_signal(self, sig: int, frame: Any) -> None:
        """Runs as a signal handler: the work goes to the loop (before the loop runs there is none)."""
        if sig == signal.SIGHUP:
            work, args = self._on_hup, ()
        elif sig == signal.SIGUSR2 and self.hooks.enabled:
            work, args = self._hang, ()
        else:
            work, args = log.info, ("%s ignored (it has no meaning to edgespec serve)", _signal_name(sig))
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(work, *args)
            except RuntimeError:  # the loop has closed: we are stopping anyway
                pass

    def _on_hup(self) -> None:
        """SIGHUP: the API key and (serve --docs) the document index read again (in the loop)."""
        self.reload_api_key()
        if self.state.docs is not None:
            asyncio.ensure_future(self._reload_docs())

    async def _reload_docs(self) -> None:
        try:
            r, _ = await self.state.reloads.reload(self.state.engine)
            log.info("SIGHUP: documents reloaded from %s (%d passages)", r["index"], r["passages"])
        except Exception as e:  # noqa: BLE001 - whatever the folder holds, the index in use stays
            log.error("SIGHUP: the documents were not reloaded, the index in use stays: %s", e)

    def reload_docs(self, timeout: float = 60.0) -> None:
        """SIGHUP's reload from another thread (an embedding program, the tests): returns once it is done."""
        asyncio.run_coroutine_threadsafe(self._reload_docs(), self.loop).result(timeout)

    def reload_api_key(self) -> bool:
        """SIGHUP: read the API key again from where it was read at start. A key cannot be added or
        removed this way (auth on or off is a restart); a file that is now missing or bad is logged
        and the key in force stays. True when a key was (re)loaded."""
        where = self.config.api_key_file or "$CREDENTIALS_DIRECTORY/api-key"
        if self.state.api_key is None:
            log.info("SIGHUP: no API key is configured, nothing to reload (turning auth on needs a restart)")
            return False
        try:
            key = read_api_key(self.config.api_key_file)
        except ConfigError as e:
            log.error("SIGHUP: the API key was not reloaded, the previous one stays in force: %s", e)
            return False
        if key is None:
            log.error("SIGHUP: %s is gone; the previous API key stays in force", where)
            return False
        changed = key != self.state.api_key
        self.state.api_key = key
        log.info("SIGHUP: API key reloaded from %s (%s)", where, "changed" if changed else "unchanged")
        return True

    def _hang(self) -> None:
        log.warning("test hook (SIGUSR2): blocking the event loop for good after %d watchdog pings; the "
                    "watchdog will fire", self.notifier.watchdog_sent)
        while True:
            time.sleep(3600)


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:  # a number no signal has
        return str(sig)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
