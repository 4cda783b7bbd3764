"""Which execution provider ran each node of a graph, read from onnxruntime's own profile.

Why: a session "on CUDA" may still run some nodes on the CPU (an op or dtype the CUDA provider does
not register: a float32 GroupQueryAttention is the case that matters here), with Memcpy nodes
inserted around them that copy activations, or the whole KV cache, across the bus at every step.
`session.get_providers()` does not show that; the profile does: one event per node run, with its
op type and provider. scripts/gpu-check.sh reports it; tests/bench/test_gpu.py asserts on it.

Shapes: the steps run are a 4-token prefill then a 1-token and a 3-token step, so both the prefill
and the decode kernels appear.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..models.manifest import ModelFacts

KEY_OPS = ("GroupQueryAttention", "MatMulNBits")


@dataclass
class Placement:
    providers: list[str]  # what the session reports
    by_op: dict[str, dict[str, int]]  # op type -> provider -> nodes
    memcpy_nodes: list[str] = field(default_factory=list)  # names of Memcpy* nodes that ran
    nodes: dict[str, tuple[str, str]] = field(default_factory=dict)  # node name -> (op type, provider)

    def off_provider(self, provider: str, ops=KEY_OPS) -> list[str]:
        """Nodes of `ops` that did not run on `provider`."""
        return sorted(n for n, (op, p) in self.nodes.items() if op in ops and p != provider)

    def memcpy_inside_layers(self) -> list[str]:
        """Memcpy nodes whose name places them inside a decoder layer (the builder names nodes
        /model/layers.N/...): a copy per layer per step. Copies at the graph's edges (ids in,
        logits out) are expected."""
        return [n for n in self.memcpy_nodes if "/layers." in n]

    def to_dict(self) -> dict:
        return {"providers": self.providers, "by_op": self.by_op, "memcpy_nodes": self.memcpy_nodes,
                "memcpy_inside_layers": self.memcpy_inside_layers()}


def parse_profile(events: list[dict]) -> tuple[dict[str, tuple[str, str]], list[str]]:
    """onnxruntime's profile (a list of trace events) -> ({node: (op, provider)}, memcpy node names).
    Node events are cat "Node" with args.op_name and args.provider; their names end in _kernel_time."""
    nodes: dict[str, tuple[str, str]] = {}
    for e in events:
        args = e.get("args") or {}
        if e.get("cat") != "Node" or "op_name" not in args or "provider" not in args:
            continue
        name = e.get("name", "")
        for suffix in ("_kernel_time", "_fence_before", "_fence_after"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
        nodes[name] = (args["op_name"], args["provider"])
    memcpy = sorted(n for n, (op, _) in nodes.items() if op.startswith("Memcpy"))
    return nodes, memcpy


def measure(path: str | os.PathLike, facts: ModelFacts, providers=None, *, max_len: int = 64) -> Placement:
    """Runs a few steps of the graph at `path` with profiling on and returns where each node ran."""
    import onnxruntime as ort

    from ..edge.providers import default_provider_options, device_of, normalize, session_options
    from ..core.runner import ModelRunner
    from ..models.kernels import require_floor

    require_floor(ort.__version__, facts.graph_flavor())  # the same one line the engine's loader gives

    available = set(ort.get_available_providers())
    chain = [(n, default_provider_options(n)) for n in normalize(providers) if n in available]
    with tempfile.TemporaryDirectory(prefix="edgespec-placement-") as tmp:
        so = session_options()
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(path), so, providers=chain)
        got = session.get_providers()
        runner = ModelRunner(session, facts, max_len, device=device_of(got[0])).slot(0)
        runner.step([1, 2, 3, 4], 1)
        runner.step([5], 1)
        runner.step([6, 7, 8], 3)
        events = json.loads(Path(session.end_profiling()).read_text())
    nodes, memcpy = parse_profile(events)
    by_op: dict[str, dict[str, int]] = {}
    for op, prov in nodes.values():
        by_op.setdefault(op, Counter())[prov] += 1
    return Placement(providers=list(got), by_op={k: dict(v) for k, v in sorted(by_op.items())},
                     memcpy_nodes=memcpy, nodes=nodes)


def _main(argv: list[str] | None = None) -> int:
    """python -m edgespec.bench.placement BUNDLE [--providers cuda,cpu]: one JSON object, per graph of
    every model: where each op type ran, the Memcpy nodes, and the key ops off the first provider.
    Exit 1 when a GroupQueryAttention/MatMulNBits node ran elsewhere or a Memcpy sits inside a layer."""
    import argparse
    from dataclasses import replace

    from ..models.bundle import Bundle
    from ..edge.providers import normalize

    ap = argparse.ArgumentParser(prog="python -m edgespec.bench.placement")
    ap.add_argument("bundle")
    ap.add_argument("--providers", default="cuda,cpu")
    a = ap.parse_args(argv)
    b = Bundle.open(a.bundle, verify=False)
    first = normalize(a.providers)[0]
    out, bad = {}, False
    for role, facts in b.manifest.models.items():
        for flavor, g in facts.graphs().items():
            p = measure(b.root / g.path, replace(g, flavors={}), a.providers)
            off = p.off_provider(first)
            out[f"{role}:{flavor}"] = {**p.to_dict(), "key_ops_off_" + first: off}
            if off or p.memcpy_inside_layers():  # the reason, in the step's log (the JSON goes to a file)
                bad = True
                print(f"placement: {role}:{flavor} on {p.providers[0]}: {len(off)} {'/'.join(KEY_OPS)} nodes off "
                      f"{first}, {len(p.memcpy_inside_layers())} Memcpy nodes inside layers", file=sys.stderr)
    print(json.dumps(out, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(_main())
