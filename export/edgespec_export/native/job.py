"""The native strategy of the export job (job.GraphSource): GGUF -> graph (streamed) -> contract edits,
checked against the GGUF's own numpy forward pass. No torch, transformers or onnxruntime-genai: onnx,
numpy, gguf and the runtime's onnxruntime.
"""
from __future__ import annotations

from ..contract import Built, apply_contract, facts_from_config, graph_file, graph_flavor
from ..progress import Progress


class GGUFGraph:
    """A GGUF written as a graph tensor by tensor (native/model.py), its blocks kept where they map."""

    reference = "gguf dequantized, numpy float32"
    reference_first = False  # after the graph's session is gone: the dequantized layers never meet it

    def __init__(self, job):  # a job.ModelJob
        self.job = job
        self.gg = None

    def load(self, progress: Progress) -> None:
        from .gguf_model import GGUFModel

        self.gg = GGUFModel(self.job.source.path, f"{self.job.role} source")

    def reference_logprobs(self, ids: list[int], usable_vocab: int, progress: Progress):
        from .reference import reference_logprobs

        with progress.stage(f"parity {self.job.role} (gguf, numpy)", total=self.gg.config.layers + 1,
                            unit="layer") as bar:
            return reference_logprobs(self.gg, ids, usable_vocab, bar)

    def build(self, progress: Progress) -> Built:
        from ..quantize import default_block_size
        from .model import write_graph
        from .plan import Plan, settings_for

        job, gg = self.job, self.gg
        cfg = gg.config.hf_dict()
        flavor = graph_flavor(job.quant, job.ep)
        keep = job.keep_gguf_quant
        c = gg.config
        # the rounded tensors' block size: as asked, else quantize.py's default for this model (the builder's)
        block_size = job.block_size or default_block_size(c.hidden, c.ffn, c.heads * c.head_dim, role=job.role)
        plan = Plan(quant=None if keep and job.quant in ("int4", "int8") else job.quant,
                    settings=settings_for(job.quant, block_size, job.accuracy_level, job.head_bits),
                    minimum=job.gguf_minimum, q6k_block=job.gguf_q6k_block or None,
                    body_block=job.gguf_body_block, q6k_bits=job.gguf_q6k_bits)
        job.out_dir.mkdir(parents=True, exist_ok=True)
        name = graph_file(flavor, primary=job.primary)
        onnx_path = job.out_dir / name
        n_weights = sum(1 for n in gg.tensors if n.endswith(".weight") and len(gg.tensors[n].shape) == 2)
        with progress.stage(f"build {job.role} (native)", total=n_weights + 1, unit="tensor") as bar:
            builder = write_graph(gg, onnx_path, plan, fp16=flavor == "cuda", on_tensor=lambda _n: bar.update(1))
            apply_contract(onnx_path, flavor, cfg["hidden_size"], job.role)
            bar.update(1)

        quant, block_size = model_quant(builder.report, job.quant, block_size)
        facts = facts_from_config(cfg, job.out_dir, quant=quant, block_size=block_size,
                                  accuracy_level=job.accuracy_level, name=name, flavor=flavor)
        facts.head_bits = builder.report.head_bits
        if quant == "mixed":  # facts_from_config knows int4/int8 only
            facts.block_size, facts.accuracy_level = block_size, job.accuracy_level
        quant_map = {"tensors": builder.report.forms, "weight_bytes_per_token": builder.report.bytes_read,
                     "gguf_bytes_per_token": gg.step_bytes(),
                     "exporter": "native"}
        return Built(facts, onnx_path, cfg, quant_map)


def model_quant(report, asked: str, block_size: int) -> tuple[str, int]:
    """The manifest's quant and block_size, as the graph has them (models/derived.py checks both):
    int4 or int8 when every decoder MatMulNBits has those bits, "mixed" when a GGUF's 4- and 8-bit
    blocks sit side by side; the block size most weights use."""
    if not report.body_bits:  # float weights
        return asked, block_size
    bits = set(report.body_bits)
    quant = "int4" if bits == {4} else "int8" if bits == {8} else "mixed"
    return quant, max(report.body_blocks, key=report.body_blocks.get)
