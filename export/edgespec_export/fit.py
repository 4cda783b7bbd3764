"""The training loop both kinds of draft heads share (heads.py: Medusa, feature.py: the feature
drafter): torch set up for this CPU and seeded, Adam with a cosine decay over the run, batches of BATCH
training positions drawn with replacement only when there are fewer, and one optimizer step per batch.
What differs between the two, the parameters and the loss, stays with each."""
from __future__ import annotations

import math
import os

import numpy as np

BATCH = 64  # training positions per optimizer step


def torch_seeded(seed: int):
    """torch, seeded, on every core of this machine."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    return torch


def adam_cosine(params, hidden_size: int, steps: int):
    """Adam at a rate that shrinks with the hidden size, decayed to 0 over `steps` by a half cosine."""
    import torch

    opt = torch.optim.Adam(params, lr=min(3e-3, 0.03 / math.sqrt(hidden_size)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    return opt, sched


def batch_of(rng: np.random.Generator, rows: np.ndarray):
    """BATCH training positions from `rows` (a torch tensor of their indices)."""
    import torch

    return torch.from_numpy(rng.choice(rows, size=min(BATCH, rows.size), replace=rows.size < BATCH))


def step(opt, sched, loss, progress) -> None:
    """One optimizer step on `loss`, the schedule advanced, the progress bar too."""
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if progress is not None:
        progress.update(1)
