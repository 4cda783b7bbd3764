"""Execution providers: which onnxruntime backend runs a model, tried for real, in order.

A provider listed by `get_available_providers()` can still fail to create a session (missing CUDA
libraries, a TensorRT that rejects an op), so each is tried with the real model and the next one
is used on failure, with one log line saying why. onnxruntime's Python wrapper may also fall back
on its own (TensorRT -> CUDA -> CPU) and only print to stderr, so the provider a session really
got is read back from `session.get_providers()` and logged the same way.

The session for provider P also lists the providers after P in the requested order: TensorRT takes
the subgraphs it can build engines for and leaves the rest (GroupQueryAttention, MatMulNBits) to
CUDA, instead of to the CPU. For these graphs that leaves TensorRT only the elementwise pieces
between the contrib ops, so it is not in the default order (docs/edge.md, "TensorRT"); it is
still tried when asked for by name. The draft model can be given its own order (e.g. CPU cores while the
target runs on the GPU).

TensorRT engines are cached under the state folder ($STATE_DIRECTORY when systemd runs us, else
$EDGESPEC_HOME, else ~/.cache/edgespec; then trt-cache/), so a reboot does not rebuild them.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidRequest, ProviderError
from ..models.protowire import encode_field

log = logging.getLogger("edgespec.edge.providers")

TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"
DEFAULT_ORDER = (CUDA, CPU)  # TensorRT only by name: see the module docstring
SHORT_NAMES = {"tensorrt": TRT, "trt": TRT, "cuda": CUDA, "cpu": CPU}
DEFAULT_TRT_WORKSPACE = 1 << 30  # bytes; a device profile may set its own (trt.workspace_gib)


class ProfileOrder(list):
    """A provider order that came from a device profile, not from the user (devices.engine_defaults).

    It is tried like the default order: a provider this onnxruntime lacks is skipped quietly (a
    Jetson profile lists CUDA first, and PyPI's CPU-only wheel must not log a warning per
    session for it), while an order the user typed gets a warning for every provider it lacks."""


def normalize(names) -> list[str]:
    """Accepts "cuda,cpu", ["cuda", "CPUExecutionProvider"], ... and returns full provider names.
    A name that is neither a short name nor a full onnxruntime provider name is a user error."""
    if names is None:
        return list(DEFAULT_ORDER)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out = []
    for n in names:
        full = SHORT_NAMES.get(str(n).lower(), str(n))
        if not full.endswith("ExecutionProvider"):
            raise InvalidRequest(
                f"unknown execution provider {n!r}: use tensorrt, cuda, cpu or a full onnxruntime name "
                f"such as CUDAExecutionProvider", param="providers")
        if full not in out:
            out.append(full)
    if not out:
        raise InvalidRequest("empty provider list: name at least one of tensorrt, cuda, cpu", param="providers")
    return out


def default_order_text() -> str:
    """The default order as the CLI's help states it ("cuda,cpu where this onnxruntime has them")."""
    return ",".join(short_name(p) for p in DEFAULT_ORDER) + " where this onnxruntime has them"


def short_name(provider: str) -> str:
    for short, full in SHORT_NAMES.items():
        if full == provider and short != "trt":
            return short
    return provider


def device_of(provider: str) -> str:
    """Where the KV cache should live for this provider (OrtValue device name)."""
    return "cuda" if provider in (CUDA, TRT) else "cpu"


def state_dir() -> Path:
    """Where edgespec keeps state that must survive a reboot (systemd's StateDirectory= first)."""
    sd = os.environ.get("STATE_DIRECTORY")
    if sd:
        return Path(sd.split(":")[0])
    home = os.environ.get("EDGESPEC_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "edgespec"


def trt_cache_dir() -> Path:
    return state_dir() / "trt-cache"


def default_provider_options(name: str, *, profile=None, cache_dir: Path | None = None, device_id: int = 0) -> dict:
    """Options each GPU provider gets unless the caller passes its own.

    TensorRT: fp16 kernels, a workspace limit (shared memory on a Jetson: the profile's
    trt.workspace_gib), engine and timing caches on disk. CUDA: an arena that grows by what is asked,
    not in powers of two (the memory plan counts what is asked)."""
    if name == TRT:
        trt = getattr(profile, "trt", None) or {}
        cache = Path(cache_dir) if cache_dir is not None else trt_cache_dir()
        workspace = int(float(trt.get("workspace_gib", DEFAULT_TRT_WORKSPACE / (1 << 30))) * (1 << 30))
        return {
            "device_id": device_id,
            "trt_fp16_enable": bool(trt.get("fp16", True)),
            "trt_max_workspace_size": workspace,
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache),
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": str(cache),
        }
    if name == CUDA:
        return {"device_id": device_id, "arena_extend_strategy": "kSameAsRequested"}
    return {}


_shared_pool: dict[str, object] = {}  # the process-wide onnxruntime thread pool, once set up
_warned: set[str] = set()  # warnings given once per process


def use_shared_thread_pool(threads: int | None = None) -> bool:
    """Sets up onnxruntime's process-wide thread pool (once per process); returns False where this
    onnxruntime cannot. From then on every session of the process must use it (onnxruntime refuses
    per-session pools then), which session_options() takes care of.

    Why (runtime engineer): target and draft take turns on the same cores. With a pool per
    session, the threads of the session that just ran spin on after its step and steal the cores
    from the other's next step (2-core dev machine: draft steps 60 % slower); with spinning off,
    every step pays for waking its threads (1-token target steps ~20 % slower). One shared pool
    keeps its threads warm for whichever session runs next (docs/speed.md)."""
    if "ok" in _shared_pool:
        return bool(_shared_pool["ok"])
    try:
        from onnxruntime.capi import _pybind_state as C

        C.set_global_thread_pool_sizes(int(threads or 0), 1)
        _shared_pool.update(ok=True, threads=threads)
    except Exception as e:  # an onnxruntime without it
        log.info("shared onnxruntime thread pool unavailable (%s): one pool per session, no spinning", e)
        _shared_pool.update(ok=False, threads=threads)
    return bool(_shared_pool["ok"])


def shared_pool_active() -> bool:
    return bool(_shared_pool.get("ok"))


def session_options(threads: int | None = None, *, spinning: bool | None = None, shared_threads: bool = False):
    """`spinning=False` stops idle pool threads from busy-waiting between ops: less power and CPU
    time on a board, a little more latency per step; None keeps onnxruntime's default.
    `shared_threads`: use the process-wide thread pool (runner.use_shared_thread_pool) instead of
    one per session, so target and draft sessions taking turns do not fight over the cores.

    The shared pool always spins: onnxruntime reads `session.intra_op.allow_spinning` (and
    `session.force_spinning_stop`) only for per-session pools, and its Python API has no switch for
    the global pool's spinning (only the C API's OrtThreadingOptions has one; measured with
    onnxruntime 1.32: a session on the global pool with allow_spinning=0 still burns ~5 ms of CPU
    per 1.6 ms run, like one without it, against 1.8 ms per-session). So spinning=False with
    the shared pool is refused with a warning rather than pretended (see docs/edge.md)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    shared = shared_threads or shared_pool_active()
    if shared:
        so.use_per_session_threads = False
    elif threads:
        so.intra_op_num_threads = int(threads)
        so.inter_op_num_threads = 1
    if spinning is not None:
        if not shared:
            so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        elif spinning is False and "spinning" not in _warned:
            _warned.add("spinning")
            log.warning("spinning=False has no effect on onnxruntime's shared thread pool (its Python API "
                        "cannot turn the global pool's spinning off); the sessions spin")
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return so


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0][:300] if s else type(e).__name__


def _chain(order: list[str], i: int, available: set[str], options: dict) -> list[tuple[str, dict]]:
    """Provider P = order[i] followed by the available providers after it (node-level fallback)."""
    return [(n, options.get(n, {})) for n in order[i:] if n in available]


def create_session(path: str | os.PathLike, *, providers=None, threads: int | None = None, provider_options=None,
                   profile=None, spinning: bool | None = None, shared_threads: bool = False, configure=None,
                   flavor: str | None = None):
    """Returns (session, device). Tries each requested provider that this onnxruntime has.

    `providers=None` uses CUDA -> CPU (those this onnxruntime lacks are skipped quietly);
    an explicit list is tried as given, and a provider in it that this onnxruntime lacks gets a log
    line (a ProfileOrder, a device profile's default, is quiet like the default order). `profile`
    sets the TensorRT options (workspace limit, fp16) for the board. `path` may be a serialized model
    (bytes: the self-draft graph, engine/selfdraft.py); `configure(session_options)`, if given, is
    called on the options before each try (shared weights). `flavor`: the graph's flavor, whose
    onnxruntime floor is checked first (kernels.ORT_FLOORS; None: the lowest floor). Raises
    ProviderError listing every provider's reason when none works."""
    import onnxruntime as ort

    from ..models.kernels import require_floor

    require_floor(ort.__version__, flavor)  # one line naming the release needed, not onnxruntime's "invalid model"
    path, external_dir = loadable(path, flavor)
    explicit = providers is not None and not isinstance(providers, ProfileOrder)
    order = normalize(providers)
    available = set(ort.get_available_providers())
    options = {n: default_provider_options(n, profile=profile) for n in order}
    for n, o in (provider_options or {}).items():
        options[SHORT_NAMES.get(n.lower(), n)] = dict(o)
    name_of = "(in-memory graph)" if isinstance(path, bytes) else Path(path).name
    errors = []
    for i, name in enumerate(order):
        if name not in available:
            errors.append(f"{name}: not in this onnxruntime build ({missing_hint(name)})")
            if explicit:
                log.warning("provider %s requested but this onnxruntime does not have it; trying the next one",
                            short_name(name))
            continue
        if name == TRT:
            Path(options[TRT]["trt_engine_cache_path"]).mkdir(parents=True, exist_ok=True)
        if name in (TRT, CUDA):
            preload_cuda_libraries()
        chain = _chain(order, i, available, options)
        try:
            so = session_options(threads, spinning=spinning, shared_threads=shared_threads)
            if external_dir is not None:  # a graph loaded from bytes finds its weights beside its file
                so.add_session_config_entry(EXTERNAL_DIR_KEY, external_dir)
            if configure is not None:
                configure(so)
            sess = ort.InferenceSession(path if isinstance(path, bytes) else str(Path(path)), so, providers=chain)
        except Exception as e:  # onnxruntime raises plain RuntimeError/Fail for all of these
            msg = _first_line(e)
            log.warning("provider %s failed for %s (%s); trying the next one", short_name(name), name_of, msg)
            errors.append(f"{name}: {msg}")
            continue
        got = sess.get_providers()[0] if sess.get_providers() else name
        if got != name:  # onnxruntime fell back on its own
            log.warning("provider %s could not run %s: onnxruntime fell back to %s", short_name(name), name_of,
                        short_name(got))
            if got not in order[i:]:
                errors.append(f"{name}: onnxruntime fell back to {got}, which was not requested")
                continue
        return sess, device_of(got)
    hint = ""
    if explicit and CPU not in order:
        hint = " (add cpu to the list to fall back to the CPU)"
    raise ProviderError(f"no execution provider could run {name_of}: " + "; ".join(errors) + hint)


EXTERNAL_DIR_KEY = "session.model_external_initializers_file_folder_path"  # onnxruntime's session config key


def loadable(path, flavor: str | None = None):
    """(what to give InferenceSession, the folder of its external weights or None): the graph as is, or,
    where this onnxruntime's GroupQueryAttention cannot take an input a `flavor` graph wires
    (models/ortcompat.py: query_seqlens below 1.32.0, a cuda graph's position_ids below 1.24.0), its
    bytes with that input taken out."""
    from ..models.ortcompat import STRIPPABLE, missing_inputs, strip_inputs

    drop = missing_inputs(flavor=flavor)
    if not drop:
        return path, None
    model = path if isinstance(path, bytes) else Path(path).read_bytes()
    stripped, changed = strip_inputs(model, drop)
    if not changed:
        return path, None
    import onnxruntime as ort

    lost = "; ".join(f"{STRIPPABLE[i][0]}: {STRIPPABLE[i][1]}" for i in sorted(drop))
    log.info("onnxruntime %s cannot take GroupQueryAttention's %s: loaded without it (%d node(s); lost: %s)",
             ort.__version__, ", ".join(drop.values()), changed, lost)
    return stripped, None if isinstance(path, bytes) else str(Path(path).resolve().parent)


_preloaded = False


def preload_cuda_libraries() -> str:
    """Loads the CUDA and cuDNN libraries of the nvidia-* wheels (onnxruntime-gpu's `[cuda,cudnn]`
    extras) before the first CUDA session: onnxruntime finds them only then
    (`onnxruntime.preload_dlls()`, onnxruntime >= 1.21). Once per process, and only where those
    wheels are installed (JetPack's system CUDA needs nothing). Returns one line on what it did."""
    global _preloaded
    import importlib.util

    import onnxruntime as ort

    fn = getattr(ort, "preload_dlls", None)
    if _preloaded:
        return "already preloaded"
    if importlib.util.find_spec("nvidia") is None:
        return "no nvidia-* wheels: CUDA from the system's library path"
    if fn is None:
        return f"onnxruntime {ort.__version__} has no preload_dlls (added in 1.21): put the CUDA libraries on the loader's path"
    try:
        fn()
    except Exception as e:  # a failed preload shows up as the CUDA provider failing, with its reason
        log.info("onnxruntime.preload_dlls() failed: %s", _first_line(e))
        return f"preload_dlls() failed: {_first_line(e)}"
    _preloaded = True
    return f"onnxruntime {ort.__version__}: preload_dlls() done"


def missing_hint(name: str) -> str:
    if name in (TRT, CUDA):
        return "needs onnxruntime-gpu; see `edgespec doctor`"
    return "see `edgespec doctor`"


# --- probing (doctor) ----------------------------------------------------------------------------
def _tensor_value_info(name: str, dims: list[int]) -> bytes:
    shape = b"".join(encode_field(1, encode_field(1, d)) for d in dims)  # TensorShapeProto.dim{dim_value}
    tensor_type = encode_field(1, 1) + encode_field(2, shape)  # elem_type FLOAT, shape
    # ValueInfoProto{name, TypeProto{tensor_type}}
    return encode_field(1, name) + encode_field(2, encode_field(1, tensor_type))


def probe_model_bytes(n: int = 8) -> bytes:
    """A serialized ONNX model, Y = MatMul(X [1,n], W [n,n]), written by hand so that probing a
    provider needs neither the `onnx` package nor a file shipped with edgespec."""
    node = (encode_field(1, "X") + encode_field(1, "W") + encode_field(2, "Y") + encode_field(3, "probe")
            + encode_field(4, "MatMul"))
    graph = (encode_field(1, node) + encode_field(2, "edgespec-probe")
             + encode_field(11, _tensor_value_info("X", [1, n])) + encode_field(11, _tensor_value_info("W", [n, n]))
             + encode_field(12, _tensor_value_info("Y", [1, n])))
    opset = encode_field(1, "") + encode_field(2, 17)
    return encode_field(1, 8) + encode_field(2, "edgespec") + encode_field(7, graph) + encode_field(8, opset)


@dataclass
class ProbeResult:
    provider: str
    in_build: bool  # listed by onnxruntime.get_available_providers()
    works: bool  # created a session on this provider and computed the right answer
    error: str | None = None
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"provider": short_name(self.provider), "name": self.provider, "in_build": self.in_build,
                "works": self.works, "error": self.error, "seconds": round(self.seconds, 3)}


def probe(names=None, *, profile=None) -> list[ProbeResult]:
    """Tries a tiny MatMul session on each provider (TensorRT, CUDA, CPU by default) and checks the
    result against numpy: a provider 'works' only if it really ran it, not fell back."""
    import numpy as np

    try:
        import onnxruntime as ort
    except ImportError as e:
        return [ProbeResult(n, False, False, f"onnxruntime not importable: {e}") for n in normalize(names)]
    available = set(ort.get_available_providers())
    model = probe_model_bytes()
    x = np.arange(8, dtype=np.float32).reshape(1, 8) / 8
    w = (np.arange(64, dtype=np.float32).reshape(8, 8) % 5) - 2
    want = x @ w
    results = []
    for name in normalize(names):
        if name not in available:
            results.append(ProbeResult(name, False, False, missing_hint(name)))
            continue
        t0 = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix="edgespec-probe-") as tmp:
                opts = default_provider_options(name, profile=profile, cache_dir=Path(tmp))
                if name in (TRT, CUDA):
                    preload_cuda_libraries()
                sess = ort.InferenceSession(model, session_options(1), providers=[(name, opts)])
                got_provider = sess.get_providers()[0]
                if got_provider != name:
                    raise RuntimeError(f"onnxruntime fell back to {got_provider}")
                (y,) = sess.run(None, {"X": x, "W": w})
            ok = bool(np.allclose(y, want, atol=1e-2))
            results.append(ProbeResult(name, True, ok, None if ok else "wrong result from the probe model",
                                       time.perf_counter() - t0))
        except Exception as e:
            results.append(ProbeResult(name, True, False, _first_line(e), time.perf_counter() - t0))
    return results
