"""Every chart tfaccel draws, as PNG: the one module that uses matplotlib.

Charts are drawn on matplotlib's Agg canvas directly (a `Figure` with no
pyplot), so they need no display, leave no figure open, and never switch the
backend of the process that calls them (a notebook keeps its inline plots).
Each `plot_*` function returns PNG bytes, or writes the PNG atomically to a
path and returns the path; `summaries.write_png` takes either.

Example:

    from tfaccel import plots, summaries

    png = plots.plot_trials(rows, ["batch_size"], "examples_per_sec", title="batch size")
    summaries.write_png("runs/a/logs/train", "performance/batch_size_plot", png)
    plots.plot_sparsity(report, "runs/a/sparsity.png", target=0.8)
"""

import io as _io
import textwrap

import numpy as np

from tfaccel.errors import ConfigError
from tfaccel.io import write_bytes

DPI = 100
"""Pixels per inch of every chart: a figure of w x h inches is a PNG of 100w x 100h pixels."""

_PALETTE = ("#4c72b0", "#55a868", "#c44e52", "#8172b2", "#937860", "#ccb974", "#64b5cd",
            "#999999", "#dd8452")


def new_figure(width, height):
    """(figure, axes) of `width` x `height` inches on the Agg canvas, outside pyplot."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # deferred: matplotlib
    from matplotlib.figure import Figure  # deferred: matplotlib

    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _fit_title(ax):
    """Wraps the axes' title, as drawn, so that it stays inside the figure (none is cut off)."""
    text, fig = ax.title, ax.figure
    title = text.get_text()
    renderer = fig.canvas.get_renderer()
    box = text.get_window_extent(renderer)
    center = (box.x0 + box.x1) / 2  # the title is centered on the axes, not on the figure
    limit = 0.95 * 2 * min(center, fig.bbox.width - center)
    chars = max(len(line) for line in title.splitlines()) if title else 0
    while box.width > limit and chars > 8:
        chars = max(8, min(chars - 1, int(chars * limit / box.width)))
        text.set_text(textwrap.fill(title, chars))
        box = text.get_window_extent(renderer)


def png_bytes(fig):
    """The figure as PNG bytes at the figure's size, laid out tight, titles wrapped to fit."""
    fig.tight_layout()
    for ax in fig.axes:
        _fit_title(ax)
    fig.tight_layout()  # again: a wrapped title is taller
    buf = _io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def save_png(fig, path):
    """Writes the figure as a PNG to `path` atomically; returns `path`."""
    return write_bytes(path, png_bytes(fig))


def plot_trials(rows, label_keys, value_key, title=None):
    """PNG bytes of a bar chart of timed trials, or None when no row has a numeric `value_key`.

    Args:
      rows: list of dicts, one per trial; rows without a number under
        `value_key` (e.g. failed trials) are left out.
      label_keys: keys whose values name a bar (one line each under the bar).
      value_key: key of the bar height, also the y label.
      title: chart title.

    Returns:
      PNG bytes, max(4, 1.2 x bars) x 3.2 inches, or None.
    """
    plotted = [r for r in rows if isinstance(r.get(value_key), (int, float))]
    if not plotted:
        return None
    fig, ax = new_figure(max(4, 1.2 * len(plotted)), 3.2)
    labels = ["\n".join(str(r[k]) for k in label_keys) for r in plotted]
    ax.bar(range(len(plotted)), [r[value_key] for r in plotted], color="tab:blue")
    ax.set_xticks(range(len(plotted)), labels, fontsize=8)
    ax.set_ylabel(value_key)
    if title:
        ax.set_title(title, fontsize=10)
    return png_bytes(fig)


def plot_sparsity(report, path, target=None, title="Sparsity per layer"):
    """Bar chart (PNG) of each layer's measured sparsity, pruned layers blue and dense ones gray.

    Args:
      report: a `sparsity.sparsity_report` result.
      path: where to write the PNG.
      target: the target sparsity, drawn as a red dashed line (optional).
      title: chart title.

    Returns:
      `path` (written atomically), a chart of max(4, 0.9 x layers + 2) x 3.2 inches.
    """
    rows = report["layers"]
    fig, ax = new_figure(max(4, 0.9 * len(rows) + 2), 3.2)
    colors = ["tab:blue" if r["pruned"] else "tab:gray" for r in rows]
    ax.bar([r["layer"] for r in rows], [100 * r["sparsity"] for r in rows], color=colors)
    if target is not None:
        ax.axhline(100 * target, color="tab:red", linestyle="--", label=f"target {target:.0%}")
        ax.legend(loc="lower right")
    ax.set_ylabel("zero weights (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title + " (gray: kept dense)")
    ax.tick_params(axis="x", rotation=30)
    return save_png(fig, path)


def plot_accuracy_vs_size(rows, path, reference_accuracy=None, title="Accuracy vs size"):
    """A PNG scatter of accuracy (%) against gzipped size (KB, log scale), one point per variant.

    Args:
      rows: `report.comparison_rows` results (`variant`, `accuracy`,
        `gzip_bytes`, and `gzip_ratio` for the labels).
      path: where to write the PNG.
      reference_accuracy: the float Keras model's accuracy, drawn as a gray
        dashed line (optional).
      title: chart title.

    Returns:
      `path` (written atomically), a chart of 7 x 4.5 inches.
    """
    from matplotlib.ticker import FuncFormatter, NullFormatter  # deferred: matplotlib

    fig, ax = new_figure(7, 4.5)
    points = [(row["gzip_bytes"] / 1024, 100 * row["accuracy"], row) for row in rows]
    spread = max(0.5, max(p[1] for p in points) - min(p[1] for p in points))
    placed = []
    for x, y, row in sorted(points, key=lambda p: p[0]):
        ax.scatter([x], [y], s=50, zorder=3)
        # Stack the labels of variants that land on (nearly) the same spot.
        near = sum(1 for px, py in placed
                   if abs(np.log10(px / x)) < 0.2 and abs(py - y) < 0.08 * spread)
        placed.append((x, y))
        ax.annotate(f"{row['variant']} ({row.get('gzip_ratio', 1):.1f}x smaller)", (x, y),
                    textcoords="offset points", xytext=(6, 6 - 12 * near), fontsize=8)
    ax.margins(x=0.25, y=0.2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    if reference_accuracy is not None:
        ax.axhline(100 * reference_accuracy, color="gray", linestyle="--", linewidth=1,
                   label=f"float Keras ({100 * reference_accuracy:.2f}%)")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("gzipped size (KB, log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    return save_png(fig, path)


def plot_rates(labels, values, path, xlabel, title, log_scale=False, colors=None):
    """Horizontal bars of measured rates (e.g. examples/s), first label on top, values printed.

    Args:
      labels: one name per bar.
      values: one number per bar.
      path: where to write the PNG.
      xlabel: the axis label, with the unit.
      title: chart title.
      log_scale: a log x axis, for rates orders of magnitude apart.
      colors: one color per bar (default: a fixed palette, cycled).

    Returns:
      `path` (written atomically), a chart of 8 x max(2.5, 0.45 x bars + 1.2) inches.
    """
    labels, values = list(labels), [float(v) for v in values]
    if len(labels) != len(values) or not labels:
        raise ConfigError(f"{len(labels)} labels and {len(values)} values: give one label per "
                         "value, at least one")
    colors = list(colors or [_PALETTE[i % len(_PALETTE)] for i in range(len(labels))])
    fig, ax = new_figure(8, max(2.5, 0.45 * len(labels) + 1.2))
    ax.barh(labels[::-1], values[::-1], color=colors[::-1])
    for i, v in enumerate(values[::-1]):
        ax.text(v, i, f" {v:,.0f}", va="center")
    if log_scale:
        ax.set_xscale("log")
    ax.margins(x=0.1)  # room for the value printed after the longest bar
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=8 if len(title) > 70 else 10)
    return save_png(fig, path)


def plot_memory(bars, path=None, title="memory", device_memory=None):
    """Stacked horizontal bars of memory by kind (GB), one bar per configuration.

    Args:
      bars: ``[(label, {kind: bytes})]``, e.g. a memory plan's breakdown per setting, or
        ``("measured", {"peak": bytes})`` beside it.
      path: where to write the PNG (None: return its bytes).
      title: chart title.
      device_memory: bytes of the device, drawn as a vertical line (None: none).

    Returns:
      `path` (written atomically), or the PNG bytes.
    """
    if not bars:
        raise ConfigError("plot_memory needs at least one bar")
    kinds = list(dict.fromkeys(k for _, parts in bars for k, v in parts.items() if v))
    largest = max(sum(parts.values()) for _, parts in bars)
    scale, unit = (1e9, "GB") if largest >= 1e9 else (1e6, "MB")
    fig, ax = new_figure(9, max(2.5, 0.5 * len(bars) + 1.6))
    labels = [label for label, _ in bars][::-1]
    left = [0.0] * len(bars)
    for i, kind in enumerate(kinds):
        widths = [parts.get(kind, 0) / scale for _, parts in bars][::-1]
        ax.barh(labels, widths, left=left, label=kind, color=_PALETTE[i % len(_PALETTE)])
        left = [a + b for a, b in zip(left, widths)]
    for i, total in enumerate(left):
        ax.text(total, i, f" {total:,.3g}", va="center")
    if device_memory and device_memory <= 20 * largest:  # else the bars would be invisible
        ax.axvline(device_memory / scale, color="black", linestyle="--", label="device memory")
    elif device_memory:
        title = f"{title} (device: {device_memory / 1e9:,.1f} GB, off the scale)"
    ax.margins(x=0.12)
    ax.set_xlabel(f"{unit} (10^{9 if unit == 'GB' else 6} bytes)")
    ax.set_title(title, fontsize=8 if len(title) > 70 else 10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    _fit_texts(ax)
    return save_png(fig, path) if path else png_bytes(fig)


def _fit_texts(ax):
    """Widens `ax`'s x range until every text drawn in it (the totals at the bars' ends, the
    largest one last) ends inside the axes."""
    renderer = ax.figure.canvas.get_renderer()
    for _ in range(3):  # widening shrinks nothing, but a label's data width changes with it
        right = max((t.get_window_extent(renderer).x1 for t in ax.texts), default=0)
        edge = ax.get_window_extent(renderer).x1
        if right <= edge:
            return
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo, hi + (hi - lo) * (right - edge) / max(1.0, edge - ax.get_window_extent(
            renderer).x0) * 1.1)
