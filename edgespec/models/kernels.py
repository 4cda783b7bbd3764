"""The kernel contract: what onnxruntime's providers accept for every op our graphs use, as data.

Why a table: no GPU has been lent to this project, so a cuda-flavored graph is never run on CUDA
here. What CUDA would refuse is written down from onnxruntime's own kernel sources, row by row,
and `kernelcheck.py` checks every graph against the row of each of its nodes (export, `verify`,
Bundle.open), naming the node and the rule. The CPU table is the same kind of reading, and the
tests hold it against real CPU inference sessions in both directions (tests/models/test_kernelcheck.py):
that proves the checker; the CUDA table is then as good as its reading of the sources.

Each Kernel row: op type + domain, the element types each input may have (the kernel's type
constraints), optional inputs that must be absent, attribute values allowed, and named runtime
checks the kernel makes that the graph alone decides (kernelcheck.CHECKS), with the file of
onnxruntime's repository it was read from and which version. Updating a row: docs/graph-contract.md
("The kernel contract").
"""
from __future__ import annotations

import re
from dataclasses import dataclass

# The onnxruntime floor, per graph flavor: the oldest release that loads and runs that flavor's graphs
# (export/edgespec_export/build.py), set by what the boards have. The cpu flavor: 1.23.2, the last release with
# Python 3.10 wheels (JetPack 6 and Ubuntu 22.04 ship 3.10). The cuda flavor: 1.23.0, the older of NVIDIA's two
# JetPack 6 onnxruntime-gpu wheels (1.23.0, 1.24.0). Below 1.32.0 the loader takes out the cpu flavor's batching
# input, and below 1.24.0 a cuda graph's position_ids (models/ortcompat.py).
ORT_FLOORS = {"cpu": "1.23.2", "cuda": "1.23.0"}
ORT_FLOOR = ORT_FLOORS["cpu"]  # pyproject.toml's `cpu` extra: the `onnxruntime` wheel is the CPU build
FLOOR_SOURCES = {  # the evidence for each floor (docs/graph-contract.md, "The onnxruntime floor, per flavor")
    "cpu": "1.23.2 is the last onnxruntime with cp310 wheels. Its GroupQueryAttention schema has inputs 0-11 "
           "(onnxruntime.capi get_all_operator_schema); query_seqlens (input 16) first exists in 1.32.0, so below "
           "that the loader drops it (models/ortcompat.py) and the graph loads. Tested on the CPU provider: the "
           "tiny cpu-flavored graphs, so loaded, generate on 1.23.2 and 1.24.1 (scripts/ci-ort.sh); 1.22.1 has "
           "no float16 GatherBlockQuantized.",
    "cuda": "1.23.0 and 1.24.0 are NVIDIA's JetPack 6 onnxruntime-gpu wheels (Jetson AI Lab index jp6/cu126, "
            "cp310); PyPI's onnxruntime-gpu 1.24.1 was built from the 1.24.0 release candidate (onnxruntime issue "
            "27130). From 1.24 the CUDA GroupQueryAttention refuses only attention_bias (group_query_attention.cc "
            "ComputeInternal: 'attention_bias is not supported in GroupQueryAttention cuda kernel.'). 1.23's "
            "ComputeInternal returns 'position_ids and attention_bias are not supported in GroupQueryAttention "
            "cuda kernel.' when input 9 is wired, so below 1.24.0 the loader takes a cuda graph's position_ids "
            "out (models/ortcompat.py) and the kernel derives each token's position from seqlens_k "
            "(group_query_attention_impl.cu SeqlensToPosIdsPrompt / Token / Interactive: s, seqlens_k, past + s), "
            "the chain positions the runtime feeds; the cuda flavor verifies chains only. The strings of "
            "onnxruntime-gpu 1.23.2's CUDA provider library (PyPI, x86_64) hold that refusal, the three "
            "SeqlensToPosIds kernels, the 8-bit MatMulNBits (matmul_8bits.cu, Dequantize8Bits) and the uint8 "
            "data / float16 scales GatherBlockQuantized (GatherBlockQuantized<uint8_t, MLFloat16, ...>) the cuda "
            "flavor uses. Tested on the CPU provider: the tiny cuda-flavored graphs, so loaded, generate on "
            "1.23.2 and 1.24.1 (scripts/ci-ort.sh), and equal the graphs with position_ids on 1.32.0 "
            "(tests/models/test_ortcompat.py). Not run on a GPU.",
}
BATCH_SOURCE = ("contrib_ops/cpu/bert/group_query_attention_helper.h CheckInputs, which the CUDA kernel calls too: "
                "'batch_size must be 1 when sequence_length > 1 and past context is given.' unless query_seqlens "
                "(1.32.0) says which query rows are real; tested on the CPU provider on 1.23.2, 1.24.1 and 1.32.0")

CPU_READ = "onnxruntime 1.32.0 (its CPU kernel registry, onnxruntime.capi get_all_opkernel_def)"
CUDA_READ = ("onnxruntime main, stored snapshot of group_query_attention.cc with k_scale/v_scale and XQA "
             "(after the CUDA GQA rework that made it read position_ids, onnxruntime PR 26920 of January 2026; "
             "before the query_seqlens input of 1.32), its CheckInputs in contrib_ops/cpu/bert/"
             "group_query_attention_helper.h; held against the strings of onnxruntime-gpu 1.24.1's CUDA library")
FLOATS = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Kernel:
    """One op as one provider runs it. Input indices are the operator schema's."""

    op: str
    domain: str  # "" is ONNX's own domain, "com.microsoft" onnxruntime's contrib ops
    types: tuple[tuple[int, str, tuple[str, ...]], ...] = ()  # (input, name, element types allowed)
    absent: tuple[tuple[int, str, str], ...] = ()  # (input, name, why): optional inputs the kernel refuses
    attrs: tuple[tuple[str, tuple[int, ...], int | None], ...] = ()  # (attribute, allowed, default when unset)
    checks: tuple[str, ...] = ()  # runtime checks the graph decides (kernelcheck.CHECKS)
    source: str = ""  # path in github.com/microsoft/onnxruntime
    read_from: str = ""
    note: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op)


def _t(*specs: tuple[int, str, tuple[str, ...]]):
    return tuple(specs)


# ONNX ops the builder may emit around the contrib ops (qwen3's q/k norm, the fp16 path, llama's
# reshapes): rows that name the op and check no types (the schema's; onnxruntime type-checks at load)
SHAPE_OPS = ("Cast", "Constant", "Shape", "Slice", "Reshape", "Concat", "Unsqueeze", "Squeeze", "Transpose",
             "Identity", "Expand", "Split", "Range", "ConstantOfShape", "Tile", "Where", "Equal", "Greater",
             "Less", "Not", "And", "Or", "Softmax", "Div", "Pow", "Sqrt", "ReduceMean", "Tanh", "Erf", "Gemm",
             "Trilu", "GatherND", "ScatterND", "CumSum")
_BINARY_CPU = ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_CPU_CORE = "onnxruntime/core/providers/cpu/cpu_execution_provider.cc"
# float16 on an ONNX op with only a float kernel still runs on the CPU: the session inserts Casts around
# it (InsertCastTransformer), which is how the cuda flavor runs on the CPU provider. bfloat16 gets none.
_HALF_OK = "float16 runs through Casts the CPU session inserts (InsertCastTransformer)"

CPU: tuple[Kernel, ...] = (
    Kernel("GroupQueryAttention", "com.microsoft",
           _t((0, "query", ("float32", "float16")), (3, "past_key", ("float32", "float16", "uint8", "int8")),
              (4, "past_value", ("float32", "float16", "uint8", "int8")), (5, "seqlens_k", ("int32",)),
              (6, "total_sequence_length", ("int32",)), (9, "position_ids", ("int64",)),
              (10, "attention_bias", ("float32", "float16")), (16, "query_seqlens", ("int32",))),
           absent=((14, "q_norm_weight", "the fused q/k-norm is CUDA's (the CPU kernel refuses it)"),
                   (15, "k_norm_weight", "the fused q/k-norm is CUDA's (the CPU kernel refuses it)")),
           checks=("gqa_heads", "gqa_rotary", "gqa_rotary_head"),
           source="onnxruntime/contrib_ops/cpu/bert/group_query_attention.cc", read_from=CPU_READ),
    Kernel("MatMulNBits", "com.microsoft",
           _t((0, "A", ("float32", "float16")), (1, "B", ("uint8",)), (2, "scales", ("float32", "float16"))),
           attrs=(("bits", (2, 4, 8), None),),  # the constructor: "Only 2b, 4b and 8b quantization is supported"
           source="onnxruntime/contrib_ops/cpu/quantization/matmul_nbits.cc", read_from=CPU_READ),
    Kernel("GatherBlockQuantized", "com.microsoft",
           _t((0, "data", ("uint8", "uint4", "int4")), (1, "indices", ("int32", "int64")),
              (2, "scales", ("float32", "float16"))),
           attrs=(("bits", (2, 4, 8), 4),), checks=("block_size_pow2",),  # the schema: "bits must be 2, 4, or 8"
           source="onnxruntime/contrib_ops/cpu/quantization/gather_block_quantized.cc", read_from=CPU_READ),
    Kernel("SkipSimplifiedLayerNormalization", "com.microsoft",
           _t((0, "input", ("float32", "float64", "float16", "bfloat16"))),
           source="onnxruntime/contrib_ops/cpu/skip_layer_norm.cc", read_from=CPU_READ),
    Kernel("SimplifiedLayerNormalization", "",
           _t((0, "X", ("float32", "float64", "float16", "bfloat16"))),
           source="onnxruntime/core/providers/cpu/nn/layer_norm.cc", read_from=CPU_READ),
    Kernel("RotaryEmbedding", "com.microsoft", _t((0, "input", ("float32", "float16")), (1, "position_ids", ("int64",))),
           source="onnxruntime/contrib_ops/cpu/bert/rotary_embedding.cc", read_from=CPU_READ),
    Kernel("MatMul", "", _t((0, "A", ("float32", "float64", "int32", "int64", "uint32", "uint64", "float16"))),
           source=_CPU_CORE, read_from=CPU_READ, note=_HALF_OK),
    Kernel("Gather", "", _t((0, "data", ("float32", "float16", "bfloat16", "float64", "int8", "int16", "int32",
                                        "int64", "uint8", "uint16", "uint32", "uint64", "bool")),
                            (1, "indices", ("int32", "int64"))), source=_CPU_CORE, read_from=CPU_READ),
    *(Kernel(op, "", _t((0, "A", _BINARY_CPU + ("float16",)), (1, "B", _BINARY_CPU + ("float16",))),
             source=_CPU_CORE, read_from=CPU_READ, note=_HALF_OK) for op in ("Add", "Sub", "Mul")),
    *(Kernel(op, "", _t((0, "data_0", ("float32", "float64", "float16", "int8", "int32", "int64", "uint8", "uint32",
                                       "uint64"))), source=_CPU_CORE, read_from=CPU_READ) for op in ("Max", "Min")),
    Kernel("Neg", "", _t((0, "X", ("float32", "float64", "int8", "int16", "int32", "int64", "float16"))),
           source=_CPU_CORE, read_from=CPU_READ, note=_HALF_OK),
    Kernel("ReduceSum", "", _t((0, "data", ("float32", "float64", "int32", "int64", "float16"))),
           source=_CPU_CORE, read_from=CPU_READ, note=_HALF_OK),
    Kernel("Sigmoid", "", _t((0, "X", ("float32", "float64", "float16"))), source=_CPU_CORE, read_from=CPU_READ,
           note=_HALF_OK),
    *(Kernel(op, "", source=_CPU_CORE, read_from=CPU_READ, note="types not checked here: the schema's")
      for op in SHAPE_OPS),
)

_CUDA_CORE = "onnxruntime/core/providers/cuda/cuda_execution_provider.cc"
_PLACEMENT = ("not read line by line: an ONNX op without a CUDA kernel for its type is placed on the CPU "
              "by onnxruntime (copies, not a refusal), so the row only names the op as expected")

CUDA: tuple[Kernel, ...] = (
    Kernel("GroupQueryAttention", "com.microsoft",
           _t((0, "query", ("float16", "bfloat16")), (3, "past_key", ("float16", "bfloat16", "int8")),
              (4, "past_value", ("float16", "bfloat16", "int8")), (5, "seqlens_k", ("int32",)),
              (6, "total_sequence_length", ("int32",)), (9, "position_ids", ("int64",))),
           absent=((10, "attention_bias",
                    'the CUDA kernel returns INVALID_ARGUMENT "attention_bias is not supported in '
                    'GroupQueryAttention cuda kernel." on every run'),
                   (16, "query_seqlens",
                    "no onnxruntime-gpu release up to 1.31.1 has it (no input 16 in its schema, no query_seqlens "
                    "in its CUDA provider library), and NVIDIA's JetPack 6 wheels are 1.23.0 and 1.24.0: batched serving of "
                    "the cuda flavor runs a pass per multi-token row (core/runner.py); a cuda graph "
                    "exported with it: re-export the bundle with this edgespec")),
           checks=("gqa_heads", "gqa_rotary", "gqa_rotary_head", "gqa_head_size", "gqa_shared_cache"),
           source="onnxruntime/contrib_ops/cuda/bert/group_query_attention.cc", read_from=CUDA_READ),
    Kernel("MatMulNBits", "com.microsoft",
           _t((0, "A", FLOATS), (1, "B", ("uint8",)), (2, "scales", FLOATS)),
           attrs=(("bits", (4, 8), None),),
           source="onnxruntime/contrib_ops/cuda/quantization/matmul_nbits.cc",
           read_from="onnxruntime main, stored snapshot (kernel registrations float/MLFloat16/BFloat16; "
                     "dequantize paths for 8 bits and 4 bits)",
           note="uint8 zero points and any power-of-two block (the GGUF export's 4-bit block-32 products with "
                "zero points and its block-16 minimum term): ComputeInternal takes the fused TryMatMulNBits "
                "when `(reorder_idx_data == nullptr) && (!zero_points || !zero_points->IsDataType<T>())`, "
                "passing the uint8 zero points, else dequant_column_wise, which 'dispatches 8-bit / 4-bit x "
                "typed / uint8 zero-points' (Dequantize4Bits / Dequantize8Bits) for a cuBLAS GEMM"),
    Kernel("GatherBlockQuantized", "com.microsoft",
           _t((0, "data", ("uint8", "uint4", "int4")), (1, "indices", ("int32", "int64")), (2, "scales", FLOATS)),
           attrs=(("bits", (4, 8), 4),), checks=("block_size_pow2", "gbq_last_axis"),
           note="bits 2 is in the operator schema; the CUDA kernel read does not show 2-bit data handled",
           source="onnxruntime/contrib_ops/cuda/quantization/gather_block_quantized.cc",
           read_from="onnxruntime main, stored snapshot (REGISTER_GATHERBLOCKQUANTIZED rows; the constructor: "
                     "block_size a power of two >= 16, quantize_axis_ = GetAttrOrDefault(\"quantize_axis\", 0); "
                     "ComputeInternal: ORT_ENFORCE(quantize_axis_ == data_rank - 1) on the data as it arrives, "
                     "after any Reshape)"),
    Kernel("SkipSimplifiedLayerNormalization", "com.microsoft", _t((0, "input", ("float32", "float16"))),
           source="onnxruntime/contrib_ops/cuda/bert/skip_layer_norm.cc",
           read_from="onnxruntime main, stored snapshot (REGISTER_KERNEL_TYPED float, MLFloat16)"),
    Kernel("SimplifiedLayerNormalization", "", _t((0, "X", ("float32", "float64", "float16"))),
           source="onnxruntime/contrib_ops/cuda/layer_norm.cc",
           read_from="onnxruntime, stored snapshots: REGISTER_KERNEL_TYPED (T, U, V) rows float, double, MLFloat16 "
                     "(BFloat16 only in later snapshots than the 1.24 kernels: not taken); "
                     "core/providers/cuda/nn/layer_norm.cc registers LayerNormalization only"),
    Kernel("RotaryEmbedding", "com.microsoft", _t((0, "input", FLOATS), (1, "position_ids", ("int64",))),
           source="onnxruntime/contrib_ops/cuda/bert/rotary_embedding.cc", read_from=_PLACEMENT,
           note="not emitted by the cuda flavor (GroupQueryAttention rotates with do_rotary=1)"),
    *(Kernel(op, "", source=_CUDA_CORE, read_from=_PLACEMENT)
      for op in ("Add", "Sub", "Mul", "Max", "Min", "Neg", "ReduceSum", "Sigmoid", "MatMul", "Gather") + SHAPE_OPS),
)

# TensorRT's execution provider takes standard ONNX ops only: onnx-tensorrt's operator list
# (github.com/onnx/onnx-tensorrt, docs/operators.md) has no com.microsoft op, so GroupQueryAttention,
# MatMulNBits, GatherBlockQuantized and the fused norms stay with CUDA (or the CPU), node by node.
TENSORRT_SOURCE = "onnx/onnx-tensorrt docs/operators.md (no com.microsoft domain ops)"
TENSORRT_OPS = frozenset(("Add", "Sub", "Mul", "Max", "Min", "Neg", "ReduceSum", "Sigmoid", "MatMul", "Gather")
                         + SHAPE_OPS)

TABLES: dict[str, tuple[Kernel, ...]] = {"cpu": CPU, "cuda": CUDA}
PROVIDER_OF_FLAVOR = {"cpu": "cpu", "cuda": "cuda"}  # which provider's table a graph flavor answers to


def table(provider: str) -> dict[tuple[str, str], Kernel]:
    """{(domain, op): row} of one provider's table."""
    if provider not in TABLES:
        raise ValueError(f"no kernel table for provider {provider!r} (have {', '.join(TABLES)})")
    return {k.key: k for k in TABLES[provider]}


JETSON_WHEELS = ("on a Jetson, NVIDIA's onnxruntime-gpu for JetPack 6 from the Jetson AI Lab index "
                 "(pip install 'onnxruntime-gpu>={floor}' --index-url https://pypi.jetson-ai-lab.io/jp6/cu126; "
                 "docs/jetson.md); JetPack 5 (Python 3.8) is not supported")


def version_tuple(version: str) -> tuple[int, ...]:
    """'1.32.0' -> (1, 32, 0); '1.33.0.dev20261101' and '1.32.0rc1' -> their release numbers only."""
    out = []
    for part in version.split(".")[:3]:
        m = re.match(r"\d+", part)
        if m is None:
            break
        out.append(int(m.group()))
    return tuple(out)


def floor_problem(version: str, flavor: str | None = "cpu") -> str | None:
    """One line naming the release needed when `version` (onnxruntime.__version__) is below the floor
    of `flavor`'s graphs (ORT_FLOORS); flavor None: the lowest floor, below which no graph loads."""
    if flavor is None:
        flavor = min(ORT_FLOORS, key=lambda f: version_tuple(ORT_FLOORS[f]))
    floor = ORT_FLOORS[flavor]
    if version_tuple(version) >= version_tuple(floor):
        return None
    if flavor == "cuda":
        return (f"onnxruntime {version} is older than {floor}, the oldest release edgespec's cuda-flavored graphs "
                f"run on (its CUDA kernels have their 8-bit MatMulNBits and float16 GatherBlockQuantized): pip install "
                f"'onnxruntime-gpu>={floor}' (or 'onnxruntime>={floor}' for the CPU); "
                + JETSON_WHEELS.format(floor=floor))
    return (f"onnxruntime {version} is older than {floor}, the oldest release edgespec's {flavor}-flavored graphs "
            f"are tested on: pip install 'edgespec[cpu]' (onnxruntime>={floor}); on a GPU (onnxruntime-gpu "
            f"{ORT_FLOORS['cuda']} or newer) use a bundle exported with --ep cuda instead")


def require_floor(version: str | None = None, flavor: str | None = "cpu") -> None:
    """Raises OnnxruntimeTooOld when the installed onnxruntime is below the floor of `flavor`'s graphs
    (before any session: an older one would refuse them with its own "invalid model" error, far
    from the cause). flavor None: the lowest floor (a graph whose flavor is not known)."""
    from ..errors import OnnxruntimeTooOld

    if version is None:
        import onnxruntime

        version = onnxruntime.__version__
    problem = floor_problem(version, flavor)
    if problem:
        raise OnnxruntimeTooOld(problem)
