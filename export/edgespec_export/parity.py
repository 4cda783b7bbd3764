"""Does the exported graph still predict what the source model predicts?

A fixed text (code and prose) goes through the source model in float32 (transformers, one pass) and
through the exported graph driven by edgespec's own ModelRunner, in the steps the runtime really takes:
a prefill chunk, then a repeating mix of multi-token (verify-like) and single-token (decode) steps
with the KV cache written in place. Per position we compare the next-token distributions over the
usable vocabulary: top-1 agreement and KL(source || exported).

int4 with accuracy level 4 differs from float by design; the agreement rate is the honest number to
record (measured on the Qwen2.5-Coder pair: ~94 % for the 1.5B, ~89 % for the 0.5B).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .progress import NullProgress, Progress

TEXT_ID = "edgespec-parity-v1"
PREFILL = 128  # tokens in the first step (or a quarter of the text, if shorter)
STEP_CYCLE = (5, 1, 1, 3)  # then steps of these sizes, repeated: verify-like and decode-like
# default minimum top-1 agreement by quant (int4 acc-4 is lossy on purpose; see module docstring)
DEFAULT_MIN_TOP1 = {"int4": 0.85, "int8": 0.95, "fp16": 0.97, "fp32": 0.99}

# Written for this purpose: a mix of Python, shell, prose and a little JSON, so both code-trained and
# general models see familiar text.
PARITY_TEXT = '''import json
from pathlib import Path


def load_settings(path: Path, defaults: dict) -> dict:
    """Reads a JSON settings file and fills in anything it leaves out."""
    settings = dict(defaults)
    if path.exists():
        with open(path, encoding="utf-8") as f:
            settings.update(json.load(f))
    for key, value in settings.items():
        if value is None:
            raise ValueError(f"setting {key} has no value")
    return settings


class RingBuffer:
    def __init__(self, capacity: int):
        self.items = [None] * capacity
        self.start = 0
        self.size = 0

    def push(self, item):
        end = (self.start + self.size) % len(self.items)
        self.items[end] = item
        if self.size < len(self.items):
            self.size += 1
        else:
            self.start = (self.start + 1) % len(self.items)

    def __iter__(self):
        for i in range(self.size):
            yield self.items[(self.start + i) % len(self.items)]


if __name__ == "__main__":
    buf = RingBuffer(3)
    for n in range(5):
        buf.push(n * n)
    print(list(buf))  # [4, 9, 16]

The library above keeps the last few values it was given and forgets the oldest ones first. A small
board near a greenhouse uses it to smooth the readings of a humidity sensor: every minute it stores a
new reading, and every hour it writes the average of the buffer to a log file. When the network is
down the log grows on the local card, and when the connection comes back a shell script copies it:

    rsync -av --remove-source-files /var/log/greenhouse/ backup@10.0.0.2:/srv/greenhouse/
    systemctl restart greenhouse-logger.service

The settings file looks like this: {"interval_s": 60, "buffer": 60, "sensor": "/dev/i2c-1"}.
Questions people ask most often: how long does the card last, what happens after a power cut, and
why does the average lag behind the real humidity by about half an hour? The answer to the last one
is simple: a moving average of sixty minutes is centred thirty minutes in the past.
'''


def parity_ids(tokenizer_json: Path, max_tokens: int) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    return tok.encode(PARITY_TEXT, add_special_tokens=False).ids[:max_tokens]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32, copy=False)
    m = x.max(axis=-1, keepdims=True)
    y = x - m
    return y - np.log(np.exp(y).sum(axis=-1, keepdims=True))


def reference_logprobs(model, ids: Sequence[int], usable: int) -> np.ndarray:
    """Source model, float32, one pass: log-probabilities [T, usable]."""
    import torch

    with torch.no_grad():
        hidden = model.model(torch.tensor([list(ids)], dtype=torch.long), use_cache=False).last_hidden_state[0]
        out = np.empty((len(ids), usable), dtype=np.float32)
        for start in range(0, len(ids), 64):  # the lm_head in slices: [T, V] float logits only once
            rows = model.lm_head(hidden[start:start + 64]).float().numpy()
            out[start:start + 64] = log_softmax(rows[:, :usable])
    return out


def schedule(n: int) -> list[int]:
    """Step sizes that cover n tokens: a prefill chunk, then STEP_CYCLE repeated."""
    first = min(PREFILL, max(1, n // 4))
    steps, done, i = [first], first, 0
    while done < n:
        s = min(STEP_CYCLE[i % len(STEP_CYCLE)], n - done)
        steps.append(s)
        done += s
        i += 1
    return steps


def parity_providers(facts) -> list[str]:
    """Where a flavor's parity runs: on the provider it is for when this onnxruntime has it (the cuda
    flavor on CUDA), else on the CPU (which runs both flavors). The default CUDA-first order would load
    a cpu-flavored graph on CUDA, which the runtime refuses (edge/flavor.py)."""
    import onnxruntime as ort

    from edgespec.edge.providers import CPU, CUDA

    if facts.graph_flavor() == "cuda" and CUDA in ort.get_available_providers():
        return [CUDA, CPU]
    return [CPU]


def exported_logprobs(model_path: Path, facts, ids: Sequence[int], usable: int, progress: Progress | None = None,
                      role: str = "model") -> tuple[np.ndarray, str]:
    """The exported graph through edgespec's ModelRunner, in `schedule` steps: log-probs [T, usable],
    and the device it ran on ("cpu" | "cuda", recorded in the manifest's parity)."""
    from edgespec.engine.build import load_runner

    progress = progress or NullProgress()
    runner = load_runner(model_path, facts, max_len=len(ids) + 1, providers=parity_providers(facts))
    rows = []
    pos = 0
    steps = schedule(len(ids))
    with progress.stage(f"parity {role} (exported)", total=len(ids), unit="tok") as bar:
        for s in steps:
            out = runner.step(ids[pos:pos + s], n_logits=s)
            rows.append(log_softmax(np.array(out[:, :usable], dtype=np.float32)))
            pos += s
            bar.update(s)
    from edgespec.edge.providers import device_of

    return np.concatenate(rows), device_of(runner.session.get_providers()[0])


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    """Top-1 agreement and KL(ref || got) per position, summarised."""
    top_ref = ref.argmax(axis=1)
    top_got = got.argmax(axis=1)
    kl = (np.exp(ref) * (ref - got)).sum(axis=1)
    top5 = np.argpartition(-got, 5, axis=1)[:, :5] if got.shape[1] > 5 else np.tile(np.arange(got.shape[1]), (len(got), 1))
    return {
        "tokens": int(len(ref)),
        "top1": round(float((top_ref == top_got).mean()), 4),
        "top1_in_top5": round(float((top5 == top_ref[:, None]).any(axis=1).mean()), 4),
        "mean_kl": round(max(0.0, float(kl.mean())), 5),  # >= 0 in exact arithmetic
        "max_kl": round(max(0.0, float(kl.max())), 4),
    }
