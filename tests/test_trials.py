"""Timed trials: precision/XLA auto selection and the batch-size search, with injected
measurements (the rules), then for real."""

import json
import sys

import pytest
import tensorflow as tf
from conftest import RECIPES, run_recipe

from tfaccel import data, monitor, summaries
from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.performance import precision, trials
from tfaccel.train import models


def _fake_measure(rates, peaks=None, oom_from=None, calls=None):
    def measure(size):
        if calls is not None:
            calls.append(size)
        if oom_from is not None and size >= oom_from:
            raise tf.errors.ResourceExhaustedError(None, None, f"OOM when allocating batch {size}")
        return {"examples_per_sec": rates[size], "seconds_per_step": size / rates[size],
                "peak_memory_mb": (peaks or {}).get(size, 100.0)}
    return measure


RATES = {16: 100.0, 32: 180.0, 64: 300.0, 128: 350.0, 256: 340.0, 512: 330.0, 1024: 320.0}


def test_out_of_memory_stops_the_search_below_it():
    result = trials.search_batch_size(_fake_measure(RATES, oom_from=128), list(RATES))
    assert result.batch_size == 64
    assert [(r["batch_size"], r["status"]) for r in result.table] == [
        (16, "ok"), (32, "ok"), (64, "ok"), (128, "out of memory")]


def test_memory_budget_stops_the_search():
    peaks = {16: 100, 32: 150, 64: 250, 128: 450}
    result = trials.search_batch_size(_fake_measure(RATES, peaks), list(RATES),
                                      memory_budget_mb=300)
    assert result.batch_size == 64
    assert result.table[-1] == {"batch_size": 128, "status": "over memory budget",
                                "examples_per_sec": 350.0,
                                "ms_per_step": pytest.approx(1000 * 128 / 350),
                                "peak_memory_mb": 450}


def test_keeps_the_fastest_and_stops_when_throughput_stops_growing():
    calls = []
    result = trials.search_batch_size(_fake_measure(RATES, calls=calls), list(RATES),
                                      patience=2)
    assert result.batch_size == 128
    assert calls == [16, 32, 64, 128, 256, 512]  # two sizes without a gain, then stop


def test_nothing_fits():
    with pytest.raises(ConfigError, match="no batch size fits: 16 already ran out of memory"):
        trials.search_batch_size(_fake_measure(RATES, oom_from=16), [16, 32])


def test_candidate_sizes():
    assert trials.candidate_sizes(16, 100) == [16, 32, 64]
    with pytest.raises(ConfigError, match="range 64..32 is empty"):
        trials.candidate_sizes(64, 32)


def test_real_search_with_an_injected_out_of_memory():
    """Real trials of the digits MLP; an out-of-memory error is injected at 64."""
    splits = data.load_dataset("digits")
    model = models.build_model("mlp", splits.info.input_shape, splits.info.num_classes)
    before = [w.copy() for w in model.get_weights()]

    def measure(size):
        if size >= 64:
            raise tf.errors.ResourceExhaustedError(None, None, "injected OOM")
        return trials.measure_batch_size(model, splits.train, size, warmup=1, steps=3)

    result = trials.search_batch_size(measure, trials.candidate_sizes(16, 256))
    assert result.batch_size in (16, 32)
    ok = [r for r in result.table if r["status"] == "ok"]
    assert [r["batch_size"] for r in ok] == [16, 32]
    assert result.batch_size == max(ok, key=lambda r: r["examples_per_sec"])["batch_size"]
    for row in ok:
        rate = 1000 * row["batch_size"] / row["ms_per_step"]
        assert row["examples_per_sec"] == pytest.approx(rate)
        assert row["peak_memory_mb"] > 50  # the process's peak RSS
    assert result.table[-1]["status"] == "out of memory"
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))  # trials used copies


@pytest.mark.slow
def test_recipe_auto_batch_size_with_accumulation_and_monitor(tmp_path):
    model_dir = tmp_path / "run"
    proc = run_recipe("train", "--batch_size=auto", "--max_batch_size=64", "--grad_accum_steps=2",
                      "--epochs=1", "--monitor_every_n_steps=5", "--gpu_memory_limit=512",
                      f"--model_dir={model_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no GPU visible: a 512 MB memory limit ignored" in proc.stderr  # a warning, not a crash
    metrics = json.loads((model_dir / "metrics.json").read_text())
    table = metrics["batch_size_search"]
    assert [r["batch_size"] for r in table] == [16, 32, 64]
    best = max(table, key=lambda r: r["examples_per_sec"])["batch_size"]
    assert metrics["batch_size"] == 2 * best  # micro-batch x grad_accum_steps
    assert f"--batch_size=auto chose {2 * best}" in proc.stdout
    logs = model_dir / "logs" / "train"
    assert summaries.read_text(logs)["performance/batch_size_search"].count("| ok |") == 3
    scalars = summaries.read_scalars(logs)
    assert scalars["memory/peak_rss_mb"][0][1] > 50
    steps = -(-1257 // (2 * best))
    assert [s for s, _ in scalars["monitor/rss_mb"]] == list(range(5, steps + 1, 5))


@pytest.mark.parametrize("flag,message", [
    pytest.param("--batch_size=abc", "'abc' is not a batch size: use a positive integer, e.g. 64, "
                 "or 'auto'", marks=pytest.mark.slow),
    ("--precision=fp8", "error: unknown precision 'fp8': use one of float32, mixed_float16, "
                        "mixed_bfloat16, auto"),
])
def test_recipe_rejects_bad_flags(tmp_path, flag, message):
    proc = run_recipe("train", flag, f"--model_dir={tmp_path / 'run'}")
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_batch_size_flag_takes_an_integer_or_auto():
    sys.path.insert(0, RECIPES)
    import common

    parser = common.BatchSizeParser(allow_auto=True)
    assert parser.parse("auto") == "auto" and parser.parse(" AUTO ") == "auto"
    assert parser.parse("64") == 64 and parser.parse(64) == 64
    for bad in ("abc", "0", "-3", "1.5", True):
        with pytest.raises(ValueError, match="is not a batch size: use a positive integer"):
            parser.parse(bad)
    with pytest.raises(ValueError, match="e.g. 64$"):
        common.BatchSizeParser(allow_auto=False).parse("auto")


def test_choose_fastest_with_injected_timings():
    base = ("float32", False)
    assert trials.choose_fastest({base: 1.0, ("mixed_float16", False): 0.5}) == (
        "mixed_float16", False)
    assert trials.choose_fastest({base: 1.0, ("mixed_float16", False): 1.2,
                                  ("float32", True): 1.01}) == base
    assert trials.choose_fastest({base: 1.0, ("float32", True): 0.95}, min_speedup=1.1) == base
    with pytest.raises(ConfigError, match="baseline"):
        trials.choose_fastest({("float32", True): 1.0})


def test_auto_select_searches_precision_then_xla(monkeypatch):
    # Injected step times: bfloat16 is fastest, and faster still with XLA.
    fake = {("float32", False): 0.010, ("mixed_float16", False): 0.012,
            ("mixed_bfloat16", False): 0.006, ("mixed_bfloat16", True): 0.004,
            ("mixed_float16", True): 0.013}
    seen = []

    def fake_timing(model, dataset, batch_size, warmup, steps):
        key = (model.layers[1].dtype_policy.name, bool(model._jit_compile))
        seen.append(key)
        return {"seconds_per_step": fake[key], "steps_per_sec": 1 / fake[key],
                "examples_per_sec": batch_size / fake[key]}

    monkeypatch.setattr(monitor, "time_training", fake_timing)
    model = models.build_model("mlp", (8, 8, 1), 10, hidden=(8,))
    choice = trials.auto_select(model, None, batch_size=32)
    assert list(dict.fromkeys(seen)) == [("float32", False), ("mixed_float16", False),
                                         ("mixed_bfloat16", False), ("mixed_bfloat16", True)]
    assert (choice.precision, choice.jit_compile) == ("mixed_bfloat16", True)
    assert [round(r["speedup"], 3) for r in choice.table] == [1.0, 0.833, 1.667, 2.5]
    # 3 interleaved rounds each (bfloat16 without XLA: 3 in stage 1, 3 more against XLA).
    assert [r["rounds"] for r in choice.table] == [3, 3, 6, 3]
    assert keras.mixed_precision.global_policy().name == "float32"
    # A fixed precision with jit auto: only XLA on/off of that precision.
    seen.clear()
    choice = trials.auto_select(model, None, 32, precisions=("mixed_float16",))
    assert list(dict.fromkeys(seen)) == [("mixed_float16", False), ("mixed_float16", True)]
    assert choice.precision == "mixed_float16" and choice.jit_compile is False


def test_auto_select_drops_settings_that_cannot_win(monkeypatch):
    fake = {("float32", False): 0.010, ("mixed_float16", False): 0.050,
            ("mixed_bfloat16", False): 0.011}
    seen = []

    def fake_timing(model, dataset, batch_size, warmup, steps):
        seen.append((model.layers[1].dtype_policy.name, warmup, steps))
        key = (model.layers[1].dtype_policy.name, bool(model._jit_compile))
        return {"seconds_per_step": fake[key], "steps_per_sec": 1 / fake[key],
                "examples_per_sec": batch_size / fake[key]}

    monkeypatch.setattr(monitor, "time_training", fake_timing)
    model = models.build_model("mlp", (8, 8, 1), 10, hidden=(8,))
    choice = trials.auto_select(model, None, 32, jit_options=(False,), warmup=4, steps=7)
    rounds = {r["precision"]: r["rounds"] for r in choice.table}
    assert rounds == {"float32": 3, "mixed_float16": 1, "mixed_bfloat16": 3}  # 5x slower: dropped
    assert seen[:3] == [(p, 4, 1) for p in ("float32", "mixed_float16", "mixed_bfloat16")]
    # Timed rounds: 7 steps each, but float16's round is cut to what fits in 3x float32's
    # (3 * 7 * 10 ms = 210 ms: 4 steps of 50 ms) instead of costing 7 slow steps.
    assert seen[3:] == [(p, 1, n) for p, n in (
        ("float32", 7), ("mixed_float16", 4), ("mixed_bfloat16", 7),
        ("float32", 7), ("mixed_bfloat16", 7), ("float32", 7), ("mixed_bfloat16", 7))]
    assert (choice.precision, choice.jit_compile) == ("float32", False)


@pytest.mark.slow
def test_recipe_auto_keeps_the_fastest_measured_setting(tmp_path):
    # The rule, on any CPU: the setting kept is the fastest of the trial table, unless nothing
    # beat float32 without XLA by MIN_SPEEDUP; never one measured slower than float32. (Without
    # bf16 hardware that is float32; on a CPU with AMX it is mixed_bfloat16.)
    model_dir = tmp_path / "run"
    proc = run_recipe("train", "--precision=auto", "--jit_compile=auto", "--epochs=1",
                      "--monitor_every_n_steps=0", f"--model_dir={model_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    table = metrics["auto_precision_trials"]
    timings = {(t["precision"], t["jit_compile"]): t["ms_per_step"] for t in table}
    baseline = timings[trials.BASELINE]
    for t in table:
        assert t["speedup"] == pytest.approx(baseline / t["ms_per_step"], rel=1e-6), t
    # Stage 1: every precision without XLA; stage 2: XLA for the stage-1 winner.
    stage1 = {k: v for k, v in timings.items() if not k[1]}
    assert sorted(k[0] for k in stage1) == sorted(precision.PRECISIONS)
    winner = trials.choose_fastest(stage1, min_speedup=trials.MIN_SPEEDUP)
    assert [(t["precision"], t["jit_compile"]) for t in table[3:]] == [(winner[0], True)]
    fastest = min(timings, key=timings.get)
    expected = fastest if baseline / timings[fastest] >= trials.MIN_SPEEDUP else \
        trials.BASELINE
    chosen = (metrics["precision"], metrics["jit_compile"])
    assert chosen == expected, table
    assert timings[chosen] <= baseline  # never slower than float32 as measured
    assert f"auto chose precision {chosen[0]}, jit_compile {chosen[1]}" in proc.stdout
    assert "| mixed_bfloat16 | False |" in proc.stdout  # the measured table, in the log
    texts = summaries.read_text(model_dir / "logs" / "train")
    assert texts["performance/auto_precision"].count("\n") == len(table) + 1
    images = summaries.read_image_tags(model_dir / "logs" / "train")
    assert "performance/auto_precision_plot" in images
    assert (model_dir / "auto_precision.png").stat().st_size > 1000
