"""The bench's PNG: decode tokens/s by mode per category (with the target alone as the reference
line each mode is compared to) and acceptance by category for the speculative modes.

matplotlib is an optional extra (`pip install 'edgespec[plot]'`): without it, `--plot` fails with
one line saying so, before any model is loaded.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import EdgespecError


class PlotUnavailable(EdgespecError):
    pass


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable("--plot needs matplotlib: pip install 'edgespec[plot]' (or leave out --plot)") from None


def plot(rows: Sequence, path: str | Path, title: str = "") -> Path:
    """`rows`: bench_report.Row list from summarize(run, "category"). Writes a PNG, returns its path."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(r.group for r in rows))
    modes = list(dict.fromkeys(r.mode for r in rows))
    spec = [m for m in modes if m != "target"]
    by = {(r.group, r.mode): r for r in rows}
    colors = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(modes)}  # one colour per mode, both panels
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(10, 1.2 * len(groups) * (1 + len(modes) / 4)), 5.2))
    width = 0.8 / max(len(modes), 1)
    crowded = len(modes) > 4
    for i, m in enumerate(modes):
        xs = [g + (i - (len(modes) - 1) / 2) * width for g in range(len(groups))]
        ys = [by[(gr, m)].tokens_per_s if (gr, m) in by else 0.0 for gr in groups]
        bars = ax1.bar(xs, ys, width, label=m, color=colors[m])
        for x, gr, b in zip(xs, groups, bars):
            r = by.get((gr, m))
            if r is not None and r.speedup is not None and m != "target":
                ax1.annotate(f"{r.speedup:.2f}x", (x, b.get_height()), ha="center", va="bottom",
                             fontsize=6 if crowded else 7, rotation=90 if crowded else 0)
    ax1.set_xticks(range(len(groups)), groups, rotation=20)
    ax1.set_ylabel("decode tokens/s (measured)")
    ax1.set_title("tokens/s by mode (label: speed-up vs target alone)", fontsize=10)
    ax1.margins(y=0.15)
    width2 = 0.8 / max(len(spec), 1)
    for i, m in enumerate(spec):
        xs = [g + (i - (len(spec) - 1) / 2) * width2 for g in range(len(groups))]
        ys = [100 * (by[(gr, m)].acceptance or 0.0) if (gr, m) in by else 0.0 for gr in groups]
        ax2.bar(xs, ys, width2, label=m, color=colors[m])
    ax2.set_xticks(range(len(groups)), groups, rotation=20)
    ax2.set_ylabel("accepted proposals (%)")
    ax2.set_ylim(0, 100)
    ax2.set_title("acceptance by category", fontsize=10)
    handles, labels = ax1.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(modes), 8), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
