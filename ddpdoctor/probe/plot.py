"""The link map as a picture (`ddpdoctor probe --links --plot FILE.png|.svg`): two heatmaps, bandwidth
and latency, row sends to column, slow pairs outlined. matplotlib is the optional `plot` extra;
nothing else in the probe needs it."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

FORMATS = (".png", ".svg")
MISSING = "--plot needs matplotlib: pip install 'ddpdoctor[plot]'"


def plot_problem(path: str) -> "str | None":
    """Why `path` cannot be drawn here (checked before any rank starts), or None."""
    if Path(path).suffix.lower() not in FORMATS:
        return f"--plot {path}: the picture is written as .png or .svg"
    if importlib.util.find_spec("matplotlib") is None:
        return MISSING
    return None


def draw_link_map(detail: dict[str, Any], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from ddpdoctor.probe.linkmap import slow_cells

    n = len(detail["bandwidth_GBps"])
    slow = slow_cells(detail)
    size = max(4.0, 0.6 * n + 2.5)
    figure, axes = plt.subplots(1, 2, figsize=(2 * size, size), constrained_layout=True)
    panels = (("bandwidth_GBps", "bandwidth (GB/s)", "viridis"), ("latency_us", "latency (us)", "viridis_r"))
    for ax, (key, label, cmap) in zip(axes, panels):
        values = [[float("nan") if v is None else float(v) for v in row] for row in detail[key]]
        image = ax.imshow(values, cmap=cmap)
        figure.colorbar(image, ax=ax, shrink=0.8, label=label)
        ax.set_title(label)
        ax.set_xlabel("to rank")
        ax.set_ylabel("from rank")
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        if n <= 16:
            for a in range(n):
                for b in range(n):
                    value = values[a][b]
                    if value == value:  # not NaN (the diagonal)
                        red, green, blue, _ = image.cmap(image.norm(value))
                        light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.5
                        ax.text(b, a, f"{value:.0f}" if value >= 100 else f"{value:.3g}", ha="center", va="center",
                                fontsize=8, color="black" if light else "white")
        for a, b in slow:
            ax.add_patch(Rectangle((b - 0.5, a - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
    figure.suptitle(title)
    figure.savefig(path)
    plt.close(figure)
