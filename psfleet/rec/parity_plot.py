"""``parity.png``: each configuration's test AUC difference to the single-process
reference (:mod:`psfleet.rec.parity`), with the ±tolerance band shaded.

One point per configuration at its median difference, error bars from its smallest
to its largest run (each minus the reference's median; the reference's own bar shows
how much repeats of one process vary). Drawn on matplotlib's Agg canvas without
pyplot (the process's backend is untouched), written under a temporary name and
renamed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from psfleet.rec.curves import save_png

__all__ = ["PARITY_PNG", "plot_parity"]

PARITY_PNG = "parity.png"


def plot_parity(path: Path, rows: Sequence[Mapping[str, Any]], tolerance: float,
                title: str = "") -> Path:
    """Draw the AUC differences of ``rows`` into a PNG at ``path`` (atomically).

    Args:
        path: the PNG to write (its folder must exist).
        rows: :func:`psfleet.rec.parity.summarise` rows; those without a difference
            (every run failed) are drawn as a red ``x`` at 0 and labelled failed.
        tolerance: the half-width of the shaded band, in AUC.
        title: the figure's title.

    Raises:
        OSError: the file cannot be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(max(6.0, 1.3 * len(rows) + 2), 4.5), dpi=100)
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    ax.axhspan(-tolerance, tolerance, color="tab:green", alpha=0.15,
               label=f"±{tolerance:g} tolerance")
    ax.axhline(0.0, color="gray", linewidth=0.8)
    for x, row in enumerate(rows):
        diff = row["auc_diff"]
        if diff is None:
            ax.plot([x], [0.0], "x", color="tab:red", markersize=10)
            ax.annotate("failed", (x, 0.0), textcoords="offset points", xytext=(0, 8),
                        ha="center", color="tab:red")
            continue
        inside = row["within_tolerance"]
        low, high = diff - row["auc_diff_min"], row["auc_diff_max"] - diff
        ax.errorbar([x], [diff], yerr=[[low], [high]], fmt="o", capsize=5,
                    color="tab:blue" if inside else "tab:red")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r['configuration']}\n({r['finished']}/{r['runs']} runs)"
                        for r in rows])
    ax.set_xlim(-0.5, len(rows) - 0.5)
    ax.set_ylabel("test AUC − single-process median")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="best")
    if title:
        ax.set_title(title)
    figure.tight_layout()
    return save_png(figure, path)
