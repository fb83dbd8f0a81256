"""tfaccel.plots: every chart is a real PNG of the documented size, showing what it should."""

import io
import os
import subprocess
import sys

import pytest
from PIL import Image, ImageColor

from tfaccel import plots
from tfaccel.errors import ConfigError

BLUE, GRAY, RED = (ImageColor.getrgb(c) for c in ("#1f77b4", "#7f7f7f", "#d62728"))  # tab:*


def _image(png):
    """The PNG (bytes or a path) as an RGB image, checked to be a PNG file."""
    data = png if isinstance(png, bytes) else open(png, "rb").read()
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return image.convert("RGB")


def _colors(image):
    return {rgb for _, rgb in image.getcolors(maxcolors=1 << 20)}


def _pixels(inches):
    return tuple(round(plots.DPI * v) for v in inches)


def _report(pruned):
    return {"layers": [{"layer": f"dense_{i}", "sparsity": 0.8 if p else 0.0, "pruned": p}
                       for i, p in enumerate(pruned)]}


def test_sparsity_chart_highlights_pruned_layers_and_the_target(tmp_path):
    path = tmp_path / "nested" / "sparsity.png"
    assert plots.plot_sparsity(_report([True, False, True]), path, target=0.8) == path
    image = _image(path)
    assert image.size == _pixels((max(4, 0.9 * 3 + 2), 3.2))
    assert {BLUE, GRAY, RED} <= _colors(image)
    assert [p.name for p in tmp_path.joinpath("nested").iterdir()] == ["sparsity.png"]

    dense = _image(plots.plot_sparsity(_report([False] * 6), tmp_path / "dense.png"))
    assert dense.size == _pixels((0.9 * 6 + 2, 3.2))  # wider with more layers
    assert GRAY in _colors(dense) and not {BLUE, RED} & _colors(dense)


def test_accuracy_vs_size_chart(tmp_path):
    rows = [{"variant": "float", "accuracy": 0.98, "gzip_bytes": 500_000, "gzip_ratio": 1.0},
            {"variant": "int8", "accuracy": 0.975, "gzip_bytes": 125_000, "gzip_ratio": 4.0}]
    path = str(tmp_path / "report.png")
    assert plots.plot_accuracy_vs_size(rows, path, reference_accuracy=0.981) == path
    image = _image(path)
    assert image.size == _pixels((7, 4.5))
    assert BLUE in _colors(image)  # the first point (matplotlib's first color)
    assert len(_colors(image)) > 10  # points, labels, grid, reference line: not a blank figure


def test_trial_chart_leaves_out_failed_trials():
    rows = [{"batch_size": b, "examples_per_sec": 100.0 * b} for b in (16, 32, 64, 128)]
    rows.append({"batch_size": 256, "status": "out of memory"})
    png = plots.plot_trials(rows, ["batch_size"], "examples_per_sec", title="batch size")
    image = _image(png)
    assert image.size == _pixels((max(4, 1.2 * 4), 3.2))  # 4 bars: the failed trial has none
    assert BLUE in _colors(image)
    assert plots.plot_trials(rows[-1:], ["batch_size"], "examples_per_sec") is None


def _draw_long_title(kind, path):
    title = "MMMMMMMM " * 12
    if kind == "trials":
        rows = [{"setting": "a", "value": 1.0}, {"setting": "b", "value": 2.0}]
        return plots.plot_trials(rows, ["setting"], "value", title=title)
    # Long bar labels push the axes, and the title centered on them, to the right.
    return plots.plot_rates(["a long label of a pipeline", "b"], [1.0, 2.0], path, "x", title)


@pytest.mark.parametrize("kind", ["trials", "rates"])
def test_long_titles_are_wrapped_not_cut_off(kind, tmp_path):
    image = _image(_draw_long_title(kind, tmp_path / "t.png"))
    # A title wider than the chart would run off its sides: the edges' top rows stay white.
    width = image.size[0]
    for left in (0, width - 3):
        assert _colors(image.crop((left, 0, left + 3, 60))) == {(255, 255, 255)}


def test_rate_chart(tmp_path):
    names = ["serial", "hand-optimized", "tfaccel", "tfaccel cached"]
    path = plots.plot_rates(names, [1000, 1800, 1900, 40000], tmp_path / "rates.png",
                            "images/s", "throughput", log_scale=True)
    image = _image(path)
    assert image.size == _pixels((8, max(2.5, 0.45 * len(names) + 1.2)))
    assert {ImageColor.getrgb(c) for c in plots._PALETTE[:4]} <= _colors(image)
    with pytest.raises(ConfigError, match="2 labels and 1 values"):
        plots.plot_rates(["a", "b"], [1.0], tmp_path / "bad.png", "x", "t")
    assert not os.path.exists(tmp_path / "bad.png")


def test_plotting_leaves_the_callers_matplotlib_backend_alone(tmp_path):
    code = ("import sys, matplotlib\n"
            "from tfaccel import plots\n"
            f"plots.plot_sparsity({_report([True])!r}, {str(tmp_path / 'p.png')!r})\n"
            "print(matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules)\n")
    env = dict(os.environ, MPLBACKEND="svg")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["svg", "False"]
    assert _image(tmp_path / "p.png").size == _pixels((4, 3.2))


def test_memory_plot_keeps_its_largest_label_inside_the_figure(monkeypatch):
    from tfaccel import plots

    kept = {}
    monkeypatch.setattr(plots, "png_bytes", lambda fig: kept.setdefault("fig", fig) and b"")
    bars = [("a run with a long label, grad_accum_steps=4, recompute=True",
             {"activations": 123_456_789_012, "weights (float32)": 9_876_543_210}),
            ("b", {"activations": 1_000})]
    plots.plot_memory(bars, None, "memory plan")
    fig = kept["fig"]
    renderer = fig.canvas.get_renderer()
    width = fig.get_window_extent(renderer).x1
    ax = fig.axes[0]
    assert all(t.get_window_extent(renderer).x1 <= ax.get_window_extent(renderer).x1
               for t in ax.texts)
    assert all(t.get_window_extent(renderer).x1 <= width for t in ax.texts)
    assert all(t.get_window_extent(renderer).x0 >= 0 for t in ax.get_yticklabels())
