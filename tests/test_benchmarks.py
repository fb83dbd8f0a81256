"""benchmarks/: each script runs end to end on a small input and reports what it measured.

These runs use toy settings, so they check that each benchmark runs and reports
consistently, not that its targets hold (those need the full-size defaults).
"""

import ast
import json
import os
import re
import statistics
import subprocess
import sys

import pytest
from PIL import Image

from tfaccel import doctor, summaries

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
NAMES = ("bench_data", "bench_generate", "bench_lm", "bench_memory", "bench_overhead",
         "bench_parallel", "bench_precision", "bench_prune", "bench_recompute", "bench_tflite")


def _run(name, *args, timeout=600):
    return subprocess.run([sys.executable, os.path.join(BENCHMARKS, f"{name}.py"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, check=False)


def _docstring(name):
    with open(os.path.join(BENCHMARKS, f"{name}.py")) as f:
        return ast.get_docstring(ast.parse(f.read()))


@pytest.mark.parametrize("help_flag", ["--help", "--helpshort"])
@pytest.mark.parametrize("name", NAMES)
def test_help_exits_zero_and_lists_the_benchmarks_flags(name, help_flag):
    proc = _run(name, help_flag, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(_docstring(name).splitlines()[0])
    own = {"bench_tflite": "--report", "bench_prune": "--seeds", "bench_data": "--num_images",
           "bench_precision": "--precisions", "bench_overhead": "--rounds",
           "bench_memory": "--configs", "bench_lm": "--rounds", "bench_generate": "--slides",
           "bench_recompute": "--configs", "bench_parallel": "--micro_batches"}[name]
    assert f"{own}:" in proc.stdout
    assert "--output_dir:" in proc.stdout and "--out_dir: Alias for --output_dir." in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", NAMES)
def test_a_stray_argument_is_one_error_line(name):
    proc = _run(name, "results", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: unexpected arguments 'results': every option is a --flag (see --helpshort)"]


@pytest.mark.parametrize("name", ["bench_memory", "bench_recompute"])
def test_an_unknown_configuration_is_one_error_line_before_tensorflow(name):
    proc = _run(name, "--configs=cnn_f32,nope,fit_f32", timeout=120)
    known = ", ".join(_module_constant(name, "CONFIGS"))
    unknown = "nope, fit_f32" if name == "bench_memory" else "cnn_f32, nope"
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: --configs: unknown {unknown}; use some of {known}"]


@pytest.mark.parametrize("flag", ["--model=gpt2", "--model_fn=my_lms:build"])
def test_bench_lm_refuses_a_brought_model_in_one_line_naming_the_recipe(flag):
    proc = _run("bench_lm", flag, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {flag}: bench_lm.py times tfaccel's GPT only; train the model with "
        f"recipes/train_lm.py {flag} (its tokens/s and MFU are in metrics.json and "
        "TensorBoard), or drop the flag"]


def _module_constant(name, constant):
    with open(os.path.join(BENCHMARKS, f"{name}.py")) as f:
        tree = ast.parse(f.read())
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and [t.id for t in node.targets if isinstance(t, ast.Name)] == [constant]]
    return ast.literal_eval(value)


@pytest.mark.parametrize("name", NAMES)  # every benchmark has --output_dir
def test_out_dir_is_an_alias_of_output_dir(name, tmp_path):
    script = os.path.join(BENCHMARKS, f"{name}.py")
    code = (f"import sys; sys.path.insert(0, {BENCHMARKS!r}); sys.argv = [{script!r}]\n"
            f"import {name}\n"
            "from absl import flags\n"
            f"flags.FLAGS([{script!r}, '--out_dir={tmp_path / 'old'}'])\n"
            "print(flags.FLAGS.output_dir)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(tmp_path / "old")]


def _png_size(path):
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size


@pytest.mark.slow
def test_bench_data_measures_every_pipeline_over_whole_epochs(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_data.py"), "--num_images=96",
         "--source_size=48", "--image_size=32", "--batch_size=32", "--shards=2", "--repeats=2",
         f"--output_dir={out}", f"--data_dir={tmp_path / 'data'}"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a target missed at this toy size
    report = json.loads((out / "bench_data.json").read_text())
    assert report["config"]["host_allocator"] == "pooled"
    assert "host allocator pooled" in proc.stdout and "NOT IN EFFECT" not in proc.stdout
    assert report["machine"] == doctor.machine_summary() and report["machine"] in proc.stdout
    names = list(report["best"])
    assert {"serial", "hand-optimized", "hand-optimized, autotune thread off", "tfaccel",
            "tfaccel cached", "tfaccel training mode", "tfaccel training mode cached"} <= set(names)
    for name in names:
        runs = report["runs"][name]
        assert len(runs) == 2
        for run in runs:
            assert run["images"] == 96  # every pipeline read the whole epoch, no more, no less
            assert run["rate"] > 0 and run["steady"] >= run["rate"] and run["teardown"] >= 0
            assert 0 <= run["cores"] < os.cpu_count() + 0.5
            assert run["cores"] > 0 or "cached" in name  # a cached toy epoch can take < 1 ms
        assert report["best"][name] == pytest.approx(max(r["rate"] for r in runs))
    rates = {n: [r["rate"] for r in report["runs"][n]] for n in ("tfaccel", "serial")}
    per_round = [a / b for a, b in zip(rates["tfaccel"], rates["serial"])]
    assert report["paired_ratios"]["tfaccel / serial"] == pytest.approx(per_round)
    assert report["ratios"]["tfaccel / serial"] == pytest.approx(sum(per_round) / 2)
    assert report["best_ratios"]["tfaccel / serial"] == pytest.approx(
        max(rates["tfaccel"]) / max(rates["serial"]))
    serial_target = 1.4 if any(f.startswith("amx") for f in doctor.cpu_flags()) else 1.5
    assert f"tfaccel / serial >= {serial_target}" in [c["target"] for c in report["targets"]]
    assert [c["met"] for c in report["targets"]] == [
        c["measured"] >= float(c["target"].split(">=")[1]) for c in report["targets"]]
    assert proc.returncode == (0 if all(c["met"] for c in report["targets"]) else 1)
    width, height = _png_size(out / "bench_data.png")
    assert width > 0 and height > 0
    logdir = str(out / "logs")
    assert "tfaccel cached" in summaries.read_text_summaries(logdir)["bench_data/report"]
    assert "bench_data/tfaccel_cached_images_per_sec" in summaries.read_scalars(logdir)
    assert "bench_data/plot" in summaries.read_image_tags(logdir)


@pytest.mark.slow
def test_bench_overhead_times_the_recipes_callbacks_against_a_bare_fit(tmp_path):
    out = tmp_path / "out"
    proc = _run("bench_overhead", "--epochs=4", "--rounds=2", f"--output_dir={out}")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: the target missed at this size
    result = json.loads((out / "bench_overhead.json").read_text())
    runs = result["runs"]
    assert [(r["round"], r["side"]) for r in runs] == [(0, "bare"), (0, "recipe"),
                                                       (1, "recipe"), (1, "bare")]
    assert all(len(r["epoch_seconds"]) == 3 for r in runs)  # the first epoch left out
    bare = sorted(s for r in runs if r["side"] == "bare" for s in r["epoch_seconds"])
    recipe = sorted(s for r in runs if r["side"] == "recipe" for s in r["epoch_seconds"])
    assert result["ratio"] == pytest.approx((recipe[2] + recipe[3]) / (bare[2] + bare[3]))
    # Exactly the train recipe's default callbacks, each timed in every steady epoch.
    assert [c["callback"] for c in result["callbacks"]] == [
        "StopOnNonFiniteLoss", "PeriodicBackup", "ResumeReporter", "EpochCounter",
        "LearningRateLogger", "ThroughputLogger", "TensorBoard", "PeakMemoryLogger",
        "HardwareMonitor"]
    for run in runs:
        if run["side"] == "recipe":  # backed up (and checkpointed) after the last epoch only
            backup = run["callback_seconds"]["PeriodicBackup"]
            assert backup[-1] == max(backup) and backup[-1] > 10 * sorted(backup)[0]
        else:
            assert run["callback_seconds"] == {}
    assert result["target"] == {"kind": "short", "max_ratio": 1.10,
                                "met": result["ratio"] <= 1.10}
    assert proc.returncode == (0 if result["target"]["met"] else 1)
    assert f"steady epoch ratio recipe/bare {result['ratio']:.3f}" in proc.stdout
    _png_size(out / "bench_overhead.png")
    logdir = str(out / "logs")
    assert "PeriodicBackup |" in summaries.read_text_summaries(logdir)["bench/overhead"]
    assert (out / "fit.log").read_text().count("Epoch 4/4") == 2  # the recipe's verbose=2
    assert summaries.read_image_tags(logdir) == ["bench/overhead_plot"]
    assert sorted(os.listdir(out)) == ["bench_overhead.json", "bench_overhead.png", "fit.log",
                                       "logs"]  # each run's own folder is gone


@pytest.mark.slow
def test_bench_precision_times_each_setting(tmp_path):
    out = tmp_path / "out"
    proc = _run("bench_precision", "--dataset=synthetic", "--precisions=float32,mixed_bfloat16",
                "--jit_compile=false", "--warmup=1", "--steps=2", "--repeats=1",
                f"--out_dir={out}")  # the old name still works
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert [(r["precision"], r["jit_compile"]) for r in rows] == [("float32", False),
                                                                   ("mixed_bfloat16", False)]
    assert rows[0]["vs_float32"] == 1.0
    for row in rows:
        assert row["examples_per_sec"] == pytest.approx(
            results["batch_size"] * row["steps_per_sec"])
        assert row["ms_per_step"] == pytest.approx(1000 / row["steps_per_sec"])
    _png_size(out / "precision.png")
    logdir = str(out / "logs")
    assert "| mixed_bfloat16 | False |" in summaries.read_text_summaries(logdir)["bench/precision"]
    assert summaries.read_image_tags(logdir) == ["bench/precision_plot"]


@pytest.mark.slow
def test_bench_prune_summarizes_each_seeds_recipe_run(tmp_path):
    out = tmp_path / "out"
    proc = _run("bench_prune", "--seeds=0", "--epochs=1", "--prune_epochs=1",
                f"--output_dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "bench_prune.json").read_text())
    recipe = json.loads((out / "seed0" / "report.json").read_text())
    assert recipe["prune_epochs"] == 1
    (row,) = summary["rows"]
    assert row["seed"] == 0
    assert row["pruned_acc"] == recipe["pruned_test_accuracy"]
    assert row["sparsity_pruned_layers"] == recipe["sparsity"]["pruned"]["sparsity"]
    assert row["h5_gzip_ratio"] == pytest.approx(row["h5_gzip_pruned"] / row["h5_gzip_unpruned"])
    worst = summary["worst"]
    assert summary["targets_met"] == (worst["acc_change_points (>= -1.0)"] >= -1.0
                                      and worst["sparsity error points (<= 1.0)"] <= 1.0
                                      and worst["h5_gzip_ratio (<= 0.35)"] <= 0.35)
    assert f"targets met: {summary['targets_met']}" in (out / "bench_prune.md").read_text()


@pytest.mark.slow
def test_bench_tflite_runs_the_recipe_and_checks_each_target(tmp_path):
    preset = tmp_path / "quick.cfg"  # the preset, with fewer epochs and latency runs
    preset.write_text("\n".join([
        f"--flagfile={os.path.join(ROOT, 'recipes', 'presets', 'optimize_digits_cnn.cfg')}",
        "--epochs=2", "--prune_epochs=2", "--prune_hold_epochs=1", "--qat_epochs=1",
        "--latency_runs=20", "--calibration_samples=50"]) + "\n")
    model_dir, out = tmp_path / "model", tmp_path / "out"
    proc = _run("bench_tflite", f"--flagfile_preset={preset}", f"--model_dir={model_dir}",
                "--latency_runs=50", "--rounds=2", f"--output_dir={out}", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "bench_tflite.json").read_text())
    assert result["report"] == str(model_dir / "report.json")
    assert set(result["latency"]) == {"float", "int8", "qat_int8", "pruned_qat_int8"}
    assert all(v["p50_us"] > 0 for v in result["latency"].values())
    checks = {c["target"]: c for c in result["checks"]}
    assert set(checks) == {  # every variant ran, so every target is checked
        "QAT int8 accuracy vs float Keras (points)", "QAT int8 TFLite agreement with Keras QAT",
        "full-int8 PTQ accuracy vs float Keras (points)",
        "int8 latency speed-up over float (p50, re-measured)",
        "pruned+QAT int8 gzip ratio vs float TFLite",
        "pruned+QAT int8 accuracy vs float Keras (points)",
        "pruned+QAT int8 TFLite agreement with its Keras QAT model", "recipe wall time (minutes)"}
    assert checks["recipe wall time (minutes)"]["measured"] == pytest.approx(
        result["timing"]["recipe_wall_seconds"] / 60)
    for c in result["checks"]:
        assert f"{'PASS' if c['pass'] else 'FAIL'}  {c['target']}" in proc.stdout
    _png_size(out / "bench_tflite.png")
    logdir = str(out / "logs")
    assert "int8 latency speed-up over float" in summaries.read_text(logdir)["bench/tflite"]
    assert summaries.read_image_tags(logdir) == ["bench/tflite_plot"]
    assert sorted(os.listdir(out)) == ["bench_tflite.json", "bench_tflite.png", "logs"]


def test_bench_tflite_checks_an_existing_report_into_output_dir(tmp_path):
    from tfaccel.compress import tflite
    from tfaccel.keras import keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    path = tflite.convert_to_tflite(model, str(tmp_path / "model.tflite"))
    report = tmp_path / "run" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"float_keras_accuracy": 0.9, "variants": [  # one file twice
        {"variant": "float", "path": path, "accuracy": 0.9},
        {"variant": "int8", "path": path, "accuracy": 0.885}]}))
    out = tmp_path / "out"
    proc = _run("bench_tflite", f"--report={report}", "--latency_runs=20", "--rounds=2",
                f"--output_dir={out}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["bench_tflite.json", "bench_tflite.png", "logs"]
    assert sorted(os.listdir(report.parent)) == ["report.json"]  # nothing beside the report
    result = json.loads((out / "bench_tflite.json").read_text())
    assert result["report"] == str(report) and result["timing"] == {}
    assert {v: s["num_runs"] for v, s in result["latency"].items()} == {"float": 20, "int8": 20}
    checks = {c["target"]: c for c in result["checks"]}
    assert set(checks) == {"full-int8 PTQ accuracy vs float Keras (points)",
                           "int8 latency speed-up over float (p50, re-measured)"}
    assert checks["full-int8 PTQ accuracy vs float Keras (points)"]["measured"] == \
        pytest.approx(-1.5)
    assert checks["int8 latency speed-up over float (p50, re-measured)"]["measured"] == \
        pytest.approx(result["latency"]["float"]["p50_us"] / result["latency"]["int8"]["p50_us"])
    _png_size(out / "bench_tflite.png")
    logdir = str(out / "logs")
    text = summaries.read_text(logdir)["bench/tflite"]
    assert "PASS  full-int8 PTQ accuracy vs float Keras (points)" in text
    assert summaries.read_image_tags(logdir) == ["bench/tflite_plot"]
    assert f"wrote {out}: bench_tflite.json, bench_tflite.png, logs/" in proc.stdout


@pytest.mark.slow
def test_bench_memory_measure_calibrates_each_row_and_judges_its_prediction(tmp_path):
    out = tmp_path / "out"
    proc = _run("bench_memory", "--configs=mlp_f32_b256_sgd", "--repeats=1", "--steps=2",
                "--measure", f"--output_dir={out}", timeout=900)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    (r,) = json.loads((out / "bench_memory.json").read_text())["rows"]
    # the calibration: the micro-batch's 1/8, 1/4 and 1/2, each with its allocator slack
    assert set(r["calibration_peaks"]) == set(r["calibration_slack"]) == {"32", "64", "128"}
    assert all(0 <= f < 1 for f in r["calibration_slack"].values())
    assert r["measured_prediction"] == max(r["measured_line"], r["measured_graph_shifted"])
    assert r["--measure ratio"] == pytest.approx(r["measured_prediction"] / r["measured_peak"])
    assert 0.5 < r["--measure ratio"] < 2  # a prediction near the peak, not just positive
    assert r["measured_method"].startswith("measured (model.fit at batches 32, 64, 128")
    ok = 0.9 <= r["--measure ratio"] <= 1.1
    verdict = [ln for ln in proc.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert verdict and f"; --measure: {int(ok)}/1 within 0.9-1.1 (target all)" in verdict[0]


@pytest.mark.slow
def test_bench_memory_plans_the_cnn_with_onednn_off_as_an_avx2_only_cpu_runs_it(tmp_path):
    # TensorFlow leaves oneDNN off on CPUs without AVX512_VNNI/BF16, AVX-VNNI or AMX; forced
    # off here, this CPU runs the kernels such a CPU runs. The plan without the convolution
    # gradients' column buffers was 0.36 of this peak (0.47 on an AVX2-only EPYC).
    out = tmp_path / "out"
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0")
    proc = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "bench_memory.py"),
                           "--configs=cnn_sgd", "--repeats=2", "--steps=2",
                           f"--output_dir={out}"], env=env, capture_output=True, text=True,
                          timeout=600, cwd=ROOT, check=False)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert "; oneDNN off" in proc.stdout
    report = json.loads((out / "bench_memory.json").read_text())
    (row,) = report["rows"]
    assert report["onednn"] is False
    assert row["breakdown"]["kernel workspaces (oneDNN off)"] > 20e6
    assert row["measured_peak"] > 35e6  # the buffers are real: 45-47 MB measured
    assert 0.8 <= row["ratio"] <= 1.2, row["ratio"]


@pytest.mark.slow
def test_bench_memory_compares_the_plan_with_the_measured_peak(tmp_path):
    out = tmp_path / "out"
    proc = _run("bench_memory", "--configs=cnn_sgd,gpt_tiny_bf16_b256,gpt_tiny_f32_b256_rc",
                "--repeats=2", "--steps=2", f"--output_dir={out}")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads((out / "bench_memory.json").read_text())
    assert report["machine"] == doctor.machine_summary()
    rows = {r["config"]: r for r in report["rows"]}
    assert set(rows) == {"cnn_sgd", "gpt_tiny_bf16_b256", "gpt_tiny_f32_b256_rc"}
    # written after each row as well, so a stopped run keeps the rows it measured
    so_far = json.loads((out / "bench_memory.rows.json").read_text())
    assert [r["config"] for r in so_far] == ["cnn_sgd", "gpt_tiny_bf16_b256",
                                             "gpt_tiny_f32_b256_rc"]
    assert [r["measured_peak"] for r in so_far] == [rows[r["config"]]["measured_peak"]
                                                   for r in so_far]
    # with oneDNN off (TensorFlow's default on AVX2-only CPUs) the CNN's convolution
    # gradients keep 30 MiB column buffers: the plan counts them (docs/memory.md)
    assert report["onednn"] == doctor.onednn_enabled()
    workspaces = rows["cnn_sgd"]["breakdown"]["kernel workspaces (oneDNN off)"]
    assert (workspaces > 20e6) if not report["onednn"] else workspaces == 0
    for name, r in rows.items():
        assert len(r["measured_peaks"]) == 2 and r["measured_peak"] == max(r["measured_peaks"])
        assert r["ratio"] == pytest.approx(r["predicted"] / r["measured_peak"])
        assert r["predicted"] == sum(r["breakdown"].values())
        assert r["parameters"] == r["count_params"]
        # each process's chunks beyond the bytes asked for at a traced peak: at most one more
        # per buffer (a chunk is served whole only under twice the request)
        assert len(r["traced_slacks"]) == 2 and all(0 <= f < 1 for f in r["traced_slacks"])
        assert r["allocator slack"] == ", ".join(f"{100 * f:.0f}%" for f in r["traced_slacks"])
        assert 0.7 < r["ratio"] < 1.4  # the plan is near the measured peak, not just positive
    assert rows["gpt_tiny_bf16_b256"]["breakdown"]["16-bit weight casts"] > 0
    # tf_keras SGD keeps a momentum slot even at momentum 0 (read from its traced update)
    assert 0 < rows["cnn_sgd"]["breakdown"]["optimizer slots"] <= 4 * rows["cnn_sgd"]["parameters"]
    recomputed, plain = rows["gpt_tiny_f32_b256_rc"], rows["gpt_tiny_bf16_b256"]
    assert recomputed["recompute"] and not plain["recompute"]
    assert recomputed["measured_peak"] < plain["measured_peak"]  # float32, yet recomputed
    assert proc.returncode == (0 if report["met"] else 1)
    ratios = [r["ratio"] for r in rows.values()]
    assert report["met"] == (all(0.8 <= x <= 1.2 for x in ratios)
                             and sum(0.85 <= x <= 1.15 for x in ratios) >= 0.85 * len(ratios))
    assert all(r["method"] in ("graph", "closed form") for r in rows.values())
    width, height = _png_size(out / "bench_memory.png")
    assert width > 0 and height > 0
    logdir = str(out / "logs")
    assert "cnn_sgd" in summaries.read_text_summaries(logdir)["bench/memory"]
    assert "bench_memory/gpt_tiny_f32_b256_rc_ratio" in summaries.read_scalars(logdir)


@pytest.mark.slow
def test_bench_lm_times_the_language_model_recipe_against_a_bare_fit(tmp_path):
    out = tmp_path / "lm"
    proc = _run("bench_lm", "--gpt_layers=2", "--gpt_d_model=32", "--gpt_context=32",
                "--steps_per_epoch=20", "--epochs=3", "--rounds=1", "--sample_tokens=20",
                "--precision=float32", "--jit_compile=false",  # no trials: the next test's
                f"--output_dir={out}")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: the target missed, measured
    result = json.loads((out / "bench_lm.json").read_text())
    assert [r["side"] for r in result["runs"]] == ["bare", "recipe"]
    for run in result["runs"]:  # the first epoch left out; training part shorter than epoch
        assert len(run["epoch_seconds"]) == len(run["train_seconds"]) == 2
        assert all(0 < t < e for t, e in zip(run["train_seconds"], run["epoch_seconds"]))
    assert result["validation_loss"] < 4.64 and result["recipe_fit_seconds"] > 0
    rates = result["tokens_per_sec"]
    assert rates["bare"] > 0 and rates["recipe"] > 0
    assert result["ratio"] == pytest.approx(rates["recipe"] / rates["bare"])
    peak = result["peak"]["flops_per_second"]
    assert peak > 1e9 and "FLOP/cycle" in result["peak"]["how"]
    for side in ("bare", "recipe"):  # MFU = tokens/s x the traced step's FLOPs per token / peak
        assert result["mfu"][side] == pytest.approx(
            rates[side] * result["flops_per_token"] / peak)
        assert 0 < result["mfu"][side] < 1
    assert "peak" in proc.stdout and "MFLOP per token" in proc.stdout
    assert result["target"]["met"] == (result["ratio"] >= result["target"]["min_ratio"])
    assert (proc.returncode == 0) == result["target"]["met"]
    recipe = next(r for r in result["runs"] if r["side"] == "recipe")
    assert {"LanguageModelMetrics", "SampleLogger", "TensorBoard"} <= set(
        recipe["callback_seconds"])
    assert re.search(r"(PASS|FAIL)  training tokens/s recipe/bare [\d.]+", proc.stdout)
    _png_size(out / "bench_lm.png")
    assert "bench/lm" in summaries.read_text_summaries(out / "logs")
    assert result["settings"] == {side: {"precision": "float32", "jit_compile": False}
                                  for side in ("bare", "recipe")}  # no float32 side: the same
    assert result["trials"] is None and result["target"]["min_ratio"] == 0.97


@pytest.mark.slow
def test_bench_lm_by_default_trains_with_what_the_trials_chose_beside_float32(tmp_path):
    out = tmp_path / "lm"
    proc = _run("bench_lm", "--gpt_layers=2", "--gpt_d_model=32", "--gpt_context=32",
                "--steps_per_epoch=20", "--epochs=3", "--rounds=1", "--sample_tokens=0",
                "--auto_budget_seconds=60", f"--output_dir={out}")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    result = json.loads((out / "bench_lm.json").read_text())
    trials = result["trials"]
    assert trials["budget_seconds"] == 60 and len(trials["table"]) >= 3
    chosen = {"precision": result["config"]["precision"],
              "jit_compile": result["config"]["jit_compile"]}
    assert "auto chose precision" in proc.stdout and "| status |" in proc.stdout
    assert result["settings"]["bare"] == result["settings"]["recipe"] == chosen
    sides = [r["side"] for r in result["runs"]]
    if chosen == {"precision": "float32", "jit_compile": False}:
        assert sides == ["bare", "recipe"] and result["speedup_over_float32"] == 1.0
    else:  # float32 without XLA, timed beside: what the choice gained
        assert sides == ["bare", "recipe", "float32"]
        rates = result["tokens_per_sec"]
        assert result["speedup_over_float32"] == pytest.approx(rates["bare"] / rates["float32"])
        assert result["mfu"]["float32"] == pytest.approx(
            rates["float32"] * result["flops_per_token"]
            / result["peaks"]["float32"]["flops_per_second"])
    assert re.search(r"training tokens/s x[\d.]+ float32 without XLA's", proc.stdout)


@pytest.mark.slow
def test_bench_parallel_times_the_unsplit_split_and_pipelined_model(tmp_path):
    out = tmp_path / "out"
    proc = _run("bench_parallel", "--input_shape=8,8,1", "--batch_size=32",
                "--micro_batches=1,2,4", "--warmup=5", "--steps=2", "--repeats=1",
                f"--output_dir={out}")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a target missed, measured
    report = json.loads((out / "bench_parallel.json").read_text())
    k = report["stages"]
    assert k == len(report["devices"]) == 2  # --cpu_devices' default, without GPUs
    assert report["shared_allocator"] == all("CPU" in d for d in report["devices"])
    rows = {r["variant"]: r for r in report["rows"]}
    assert list(rows) == ["unsplit", "model-parallel", "pipeline M=1", "pipeline M=2",
                          "pipeline M=4"]
    base = rows["unsplit"]
    for r in rows.values():
        m = r["micro_batches"]
        assert len(r["round_seconds"]) == 1 and r["step_seconds"] == r["round_seconds"][0]
        assert r["ratio"] == pytest.approx(r["step_seconds"] / base["step_seconds"])
        assert r["examples_per_sec"] == pytest.approx(32 / r["step_seconds"])
        assert r["bubble"] == (0.0 if m is None else (k - 1) / (m + k - 1))
        losses = r["warmup_losses"]  # the 4 batches, then the first one again
        assert len(losses) == 5 and losses[4] < losses[0]
        # The same steps as the unsplit model (no dropout, no BatchNorm in the digits CNN).
        assert r["warmup_losses"] == pytest.approx(base["warmup_losses"], rel=1e-4)
        assert r["same_training"] is True and r["weights_rel_diff"] <= 0.05
        assert all(v > 0 for v in r["transient_bytes"].values())
        if m is None:
            continue
        trace = r["trace"]
        assert trace["micro_batches_seen"] == [list(range(m))] * k  # each stage, every one
        assert trace["backward_seen"] == [True] * k
        assert 0 < min(trace["stage_busy_ms"]) <= max(trace["stage_busy_ms"]) <= trace["span_ms"]
        (pair,) = trace["pairs"]
        assert 0 <= pair["pipelined"] <= pair["overlap"] <= 1
        assert 0 <= pair["gpipe_forward"] <= 1
        assert (out / trace["xplane"]).is_file()
    for one in ("model-parallel", "pipeline M=1"):  # one micro-batch: nothing to pipeline
        pair = rows[one]["trace"]["pairs"][0]
        assert pair["pipelined"] == 0 and pair["gpipe_forward"] == 0
        assert rows[one]["trace"]["two_micro_batches_at_once"] == [0.0, 0.0]
    assert all(0 <= f <= 1 for f in rows["pipeline M=4"]["trace"]["two_micro_batches_at_once"])
    target, same = report["checks"]
    assert target["measured"] == rows["pipeline M=4"]["ratio"]
    assert target["met"] == (rows["pipeline M=4"]["ratio"] <= 1.5)
    assert same["met"] and same["measured"] == max(r["loss_rel_diff"] for r in rows.values())
    assert proc.returncode == (0 if target["met"] else 1)
    assert f"{'PASS' if target['met'] else 'FAIL'}  pipeline M=4 on 2 devices" in proc.stdout
    _png_size(out / "bench_parallel.png")
    logdir = str(out / "logs")
    assert "| pipeline M=4 |" in summaries.read_text_summaries(logdir)["bench/parallel"]
    assert "bench_parallel/pipeline_M_4_ratio" in summaries.read_scalars(logdir)
    assert summaries.read_image_tags(logdir) == ["bench/parallel_plot"]


@pytest.mark.slow
def test_bench_generate_times_cached_against_uncached_generation(tmp_path):
    out = tmp_path / "out"
    proc = _run("bench_generate", "--configs=tiny@32,tiny@16", "--max_new_tokens=24",
                "--rounds=2", f"--output_dir={out}")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a target missed, measured
    report = json.loads((out / "bench_generate.json").read_text())
    assert report["config"]["machine"] == doctor.machine_summary()
    # 24 tokens after "The " fit a context of 32 (one slide) and pass one of 16 (both slides).
    assert [(r["config"], r["context"], r["slide"], r["passes_context"])
            for r in report["rows"]] == [("tiny@32", 32, 1, False), ("tiny@16", 16, 1, True),
                                         ("tiny@16", 16, 8, True)]
    for r in report["rows"]:
        assert r["same_text"] is True  # cached and uncached wrote the same text
        for side in ("cached", "uncached"):
            assert len(r["seconds"][side]) == len(r["cpu_seconds"][side]) == 2
            assert r[f"{side}_tokens_per_sec"] == pytest.approx(
                24 / statistics.median(r["seconds"][side]))
        ratios = [u / c for u, c in zip(r["seconds"]["uncached"], r["seconds"]["cached"])]
        assert r["ratio"] == pytest.approx(sum(ratios) / 2)
        assert f"{r['config']} (context {r['context']}, slide {r['slide']}): uncached" in \
            proc.stdout
    assert report["target"] == {"min_ratio": 3.0, "context": 256, "met": True}
    assert proc.returncode == 0
    assert "PASS  same text True (no run inside a context of 256" in proc.stdout
    assert re.search(r"\| tiny@32 \| 32 \| \d+ \| 1 \| False \| [\d.]+ \| [\d.]+ \| [\d.]+ \|",
                     proc.stdout)
    _png_size(out / "bench_generate.png")
    logdir = str(out / "logs")
    assert "| tiny@16 |" in summaries.read_text(logdir)["bench/generate"]
    assert "bench_generate/tiny_16_slide8_ratio" in summaries.read_scalars(logdir)
    assert summaries.read_image_tags(logdir) == ["bench/generate_plot"]
