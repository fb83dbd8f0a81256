"""The size / speed / accuracy comparison of a model's optimized variants.

`comparison_rows` turns per-variant measurements into table rows with ratios
against a baseline variant (normally the float TFLite file);
`write_report` writes the table as markdown and JSON plus a plot of accuracy
against gzipped size (`plots.plot_accuracy_vs_size`), and puts the same table
(text) and plot (image) into TensorBoard.

Example:

    from tfaccel.compress import report

    rows = report.comparison_rows(measured, baseline="float", reference_accuracy=0.981)
    report.write_report("runs/opt", "runs/opt/logs/report", rows, {"model": "cnn"})
"""

import os
import shutil

from tfaccel import plots, summaries
from tfaccel.errors import ConfigError
from tfaccel.io import write_json, write_text

COLUMNS = ("variant", "runtime", "accuracy", "accuracy_change_points", "bytes", "gzip_bytes",
           "gzip_ratio", "latency_p50_us", "latency_mean_us", "speedup", "speedup_vs_float_keras",
           "agreement_with_float", "agreement_with_source", "pruned_sparsity")
"""Columns of the comparison table, in order."""

_REQUIRED = ("variant", "accuracy", "bytes", "gzip_bytes", "latency_p50_us")


def comparison_rows(measured, baseline="float", reference_accuracy=None):
    """Table rows with ratios against the `baseline` variant.

    Args:
      measured: list of dicts, one per variant, each with at least `variant`,
        `accuracy`, `bytes`, `gzip_bytes` and `latency_p50_us` (any other keys,
        e.g. agreements and a description, are kept).
      baseline: name of the variant sizes and latencies are compared with.
      reference_accuracy: accuracy that `accuracy_change_points` is measured
        from (default: the baseline's).

    Returns:
      New dicts with `gzip_ratio` (baseline gzip bytes / this, >1 is smaller),
      `speedup` (baseline p50 latency / this, >1 is faster) and
      `accuracy_change_points` (100 x accuracy difference) added.

    Raises:
      ConfigError: a measurement lacks a required key or the baseline is missing.
    """
    for row in measured:
        missing = [k for k in _REQUIRED if k not in row]
        if missing:
            raise ConfigError(f"variant {row.get('variant', '?')!r} lacks {', '.join(missing)}")
    base = next((r for r in measured if r["variant"] == baseline), None)
    if base is None:
        names = ", ".join(r["variant"] for r in measured)
        raise ConfigError(f"baseline variant {baseline!r} is not among {names}: run it too")
    reference = base["accuracy"] if reference_accuracy is None else reference_accuracy
    return [{**row,
             "accuracy_change_points": round(100.0 * (row["accuracy"] - reference), 4) + 0.0,
             "gzip_ratio": base["gzip_bytes"] / row["gzip_bytes"],
             "speedup": base["latency_p50_us"] / row["latency_p50_us"]}
            for row in measured]


def markdown_report(rows, summary, title="Optimized variants"):
    """The report as markdown: a title, the summary as a two-column table, the comparison table."""
    columns = [c for c in COLUMNS if any(c in r for r in rows)]
    extra = [c for c in ("description",) if any(c in r for r in rows)]
    return "\n\n".join([
        f"# {title}",
        summaries.markdown_table({k: v for k, v in summary.items()
                                  if not isinstance(v, (dict, list))}),
        "## Variants (sizes in bytes, latency single-sample in microseconds; "
        "ratios vs float TFLite)",
        summaries.markdown_table(rows, columns + extra),
    ]) + "\n"


def write_report(directory, logdir, rows, summary, title="Optimized variants", step=0,
                 reference_accuracy=None, name="report"):
    """Writes <name>.json, <name>.md and <name>.png to `directory`, and both to TensorBoard.

    TensorBoard gets the markdown as text tag `<name>/table` and the plot as
    image tag `<name>/accuracy_vs_size`, in `logdir`.

    Returns:
      {'json': path, 'markdown': path, 'png': path, 'logdir': logdir}.
    """
    os.makedirs(directory, exist_ok=True)
    paths = {"json": os.path.join(directory, f"{name}.json"),
             "markdown": os.path.join(directory, f"{name}.md"),
             "png": os.path.join(directory, f"{name}.png"), "logdir": logdir}
    markdown = markdown_report(rows, summary, title)
    plots.plot_accuracy_vs_size(rows, paths["png"], reference_accuracy, title)
    write_json(paths["json"], {**summary, "variants": rows})
    write_text(paths["markdown"], markdown)
    summaries.write_text(logdir, f"{name}/table", markdown, step=step)
    summaries.write_png(logdir, f"{name}/accuracy_vs_size", paths["png"], step=step)
    return paths


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def discard(staging):
    """Removes a staging directory (left by a run that was killed before `publish`)."""
    if os.path.lexists(staging):
        _remove(staging)


def publish(staging, directory, last=("report.json", "report.md", "report.png")):
    """Moves a finished run's outputs from `staging` into `directory`, replacing older ones.

    A run writes into `staging` and publishes only once everything is written,
    so a run that fails or is killed leaves no half-set of outputs in
    `directory` that looks like a result. Each top-level entry of `staging`
    replaces the entry of the same name (other files in `directory` stay);
    the old `last` files (the report) are removed first and the new ones
    moved in last, so a report always belongs to the outputs beside it.
    """
    os.makedirs(directory, exist_ok=True)
    for name in last:
        _remove(os.path.join(directory, name))
    for name in sorted(os.listdir(staging), key=lambda n: n in last):
        target = os.path.join(directory, name)
        _remove(target)
        os.replace(os.path.join(staging, name), target)
    os.rmdir(staging)
    return directory
