"""recipes/optimize.py end to end: bad input fails early and cleanly; a short run writes the
report."""

import json
import os

import numpy as np
import pytest
from conftest import check_flag_error, check_only_chief_wrote, launch_recipe, run_recipe

from tfaccel import summaries

LAMBDA_MODEL = '''
import tf_keras as keras


def lambda_cnn(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = keras.layers.Lambda(lambda t: t * 2.0, name="double")(inputs)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))
'''


def _one_error_line(result):
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    return lines[0]


def test_unknown_variant_fails_before_writing(tmp_path):
    out = tmp_path / "run"
    check_flag_error("optimize", f"--model_dir={out}", "--variants=float,int4",
                     line="--variants=float,int4: unknown int4; choose from float, dynamic, int8, "
                     "float16, int16x8, qat_int8, pruned_qat_int8, keras3_int8, keras3_int4, "
                     "keras3_int4_per_channel")
    assert not out.exists()


@pytest.mark.slow
def test_unsupported_layer_is_listed_before_training(tmp_path):
    (tmp_path / "lambda_models.py").write_text(LAMBDA_MODEL)
    out = tmp_path / "run"
    result = run_recipe("optimize", f"--model_dir={out}", "--model_fn=lambda_models:lambda_cnn",
                        env={"PYTHONPATH": str(tmp_path)})
    line = _one_error_line(result)
    assert "double (Lambda)" in line and "--qat_skip_layers=double" in line
    assert not out.exists()


@pytest.mark.slow
def test_short_run_writes_table_plot_and_tensorboard(tmp_path):
    out = tmp_path / "run"
    result = run_recipe("optimize", f"--model_dir={out}", "--epochs=5", "--prune_epochs=2",
                        "--prune_hold_epochs=1", "--qat_epochs=1", "--latency_runs=40",
                        "--calibration_samples=50")
    assert result.returncode == 0, result.stderr[-3000:]

    report = json.loads((out / "report.json").read_text())
    rows = {row["variant"]: row for row in report["variants"]}
    assert list(rows) == ["float", "dynamic", "int8", "qat_int8", "pruned_qat_int8"]
    for row in rows.values():
        assert os.path.getsize(row["path"]) == row["bytes"]
        assert 0.5 < row["accuracy"] <= 1.0
        assert row["latency_p50_us"] > 0
        assert row["gzip_ratio"] == pytest.approx(rows["float"]["gzip_bytes"] / row["gzip_bytes"])
        assert row["accuracy_change_points"] == pytest.approx(
            100 * (row["accuracy"] - report["float_keras_accuracy"]), abs=1e-3)
    assert rows["float"]["agreement_with_source"] == 1.0
    assert rows["qat_int8"]["agreement_with_source"] >= 0.97
    assert rows["int8"]["gzip_ratio"] > 3
    assert rows["pruned_qat_int8"]["gzip_ratio"] > 2 * rows["qat_int8"]["gzip_ratio"]
    assert report["pruned_qat_int8_weight_sparsity"] == pytest.approx(0.8, abs=0.03)

    png = (out / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(out / "report.png") as image:
        assert image.size[0] > 300 and image.size[1] > 200
        assert len(np.unique(np.asarray(image.convert("L")))) > 10
    markdown = (out / "report.md").read_text()
    assert "| pruned_qat_int8 |" in markdown

    logdir = out / "logs" / "report"
    text = summaries.read_text_summaries(logdir)
    assert "| pruned_qat_int8 |" in text["report/table"] and "config/flags" in text
    assert "report/accuracy_vs_size" in summaries.read_image_tags(logdir)
    scalars = summaries.read_scalars(logdir)
    assert scalars["accuracy/int8"][-1][1] == pytest.approx(rows["int8"]["accuracy"], abs=1e-6)


RESHAPE_BN_MODEL = '''
import tf_keras as keras


def reshape_bn(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = keras.layers.Reshape((-1,), name="flat")(inputs)
    x = keras.layers.BatchNormalization(name="norm")(x)
    x = keras.layers.Dense(64, activation="relu", name="hidden")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))
'''
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def test_what_qat_rejects_stops_the_run_before_training(tmp_path):
    # TF-MOT folds a BatchNorm only into a convolution or Dense before it: this one is found
    # when the QAT model is built, which used to happen after 30 epochs of training.
    (tmp_path / "bn_models.py").write_text(RESHAPE_BN_MODEL)
    out = tmp_path / "run"
    result = run_recipe("optimize", f"--model_dir={out}", "--model_fn=bn_models:reshape_bn",
                        "--variants=pruned_qat_int8", env={"PYTHONPATH": str(tmp_path)})
    line = _one_error_line(result)
    assert "norm (BatchNormalization)" in line and "folded into the Conv2D" in line
    assert "--- float" not in result.stdout
    assert not out.exists()


@pytest.mark.slow
def test_a_killed_run_leaves_no_result_and_a_rerun_starts_clean(tmp_path):
    import signal
    import subprocess
    import sys

    from conftest import RECIPES, ROOT

    out = tmp_path / "run"
    out.mkdir()
    (out / "report.json").write_text("{}")  # a previous run's result, replaced only when complete
    args = [sys.executable, os.path.join(RECIPES, "optimize.py"), f"--model_dir={out}",
            "--epochs=2", "--variants=float,qat_int8", "--qat_epochs=1", "--latency_runs=20"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=ROOT)
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          env=env, cwd=ROOT) as proc:
        for line in proc.stdout:
            if line.startswith("--- qat"):  # float model and TFLite files written by now
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert (out / ".partial" / "float" / "model.keras").exists()
    assert sorted(os.listdir(out)) == [".partial", "report.json"]
    assert (out / "report.json").read_text() == "{}"
    result = run_recipe("optimize", *args[2:])
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (out / ".partial").exists()
    report = json.loads((out / "report.json").read_text())
    assert [row["variant"] for row in report["variants"]] == ["float", "qat_int8"]
    assert all(os.path.exists(row["path"]) for row in report["variants"])


@pytest.mark.slow
@pytest.mark.parametrize("model, first_conv", [
    ("--model=cnn", "conv_0"), ("--model=resnet", "stem_conv"),
    ("--model_fn=user_models:functional_resnet", "stem_conv")])
def test_pruned_qat_int8_keeps_sparsity_and_accuracy_on_batchnorm_models(model, first_conv,
                                                                          tmp_path):
    out = tmp_path / "run"
    # The float model's 30 epochs (fewer leave its BatchNorm statistics unsettled), shorter
    # pruning and QAT stages.
    result = run_recipe("optimize", f"--model_dir={out}", model, "--variants=float,pruned_qat_int8",
                        "--prune_epochs=6", "--prune_hold_epochs=2", "--qat_epochs=2",
                        "--latency_runs=50", env={"PYTHONPATH": TESTS_DIR})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    row = {r["variant"]: r for r in report["variants"]}["pruned_qat_int8"]
    assert row["pruned_sparsity"] >= 0.75
    assert report["float_keras_accuracy"] > 0.9
    assert row["accuracy_change_points"] >= -1.5
    assert report["pruned_layers"] and first_conv not in report["pruned_layers"]


@pytest.mark.slow
def test_two_workers_read_the_pipeline_and_only_the_chief_writes(tmp_path):
    """Under the 2-worker launcher: --model_dir holds the chief's outputs alone, and every
    variant sees the pipeline's inputs (--standardize: int8 calibrated on them too)."""
    model_dir, tmpdir = tmp_path / "run", tmp_path / "tmp"
    proc = launch_recipe("optimize", "--strategy=multi_worker", "--epochs=3",
                         "--variants=float,int8", "--standardize", "--latency_runs=20",
                         "--calibration_samples=50", f"--model_dir={model_dir}", tmpdir=tmpdir)
    assert check_only_chief_wrote(proc, model_dir, tmpdir) == [
        "flags.cfg", "float", "logs", "report.json", "report.md", "report.png", "tflite"]
    report = json.loads((model_dir / "report.json").read_text())
    assert report["distribution"] == "MultiWorkerMirroredStrategy"
    rows = {row["variant"]: row for row in report["variants"]}
    assert list(rows) == ["float", "int8"]
    assert all(row["path"].startswith(str(model_dir)) and os.path.exists(row["path"])
               for row in rows.values())
    assert report["float_keras_accuracy"] > 0.5  # chance: 0.1
    assert rows["float"]["agreement_with_source"] == 1.0  # predictions and labels in one order
    assert rows["float"]["accuracy"] == pytest.approx(report["float_keras_accuracy"], abs=1e-6)
    assert rows["int8"]["accuracy"] == pytest.approx(rows["float"]["accuracy"], abs=0.03)
    flagfile = (model_dir / "flags.cfg").read_text().splitlines()
    assert "--standardize" in flagfile and "--deterministic" in flagfile  # optimize's default


def test_keras3_variants_of_a_tf_keras_model_fail_before_writing(tmp_path):
    out = tmp_path / "run"
    result = run_recipe("optimize", f"--model_dir={out}", "--variants=float,keras3_int8")
    line = _one_error_line(result)
    assert "--variants=keras3_int8 needs a Keras 3 model" in line
    assert "--keras=keras3 or a Keras 3 .keras file" in line
    assert "--- float" not in result.stdout
    assert not out.exists()


@pytest.mark.slow
def test_the_report_on_a_keras3_model_has_the_keras3_int8_and_int4_rows(tmp_path):
    # Issue 17's must-show: its Keras 3 model (Conv2D, BatchNorm, DepthwiseConv2D, residual
    # Add, pooling, Dropout, Dense) gets Keras 3's own int8/int4 rows beside TF-MOT's QAT.
    from tfaccel.train.models import load_model_file

    out = tmp_path / "run"
    result = run_recipe("optimize", f"--model_dir={out}", "--model_fn=user_models_keras3:"
                        "residual_cnn", "--epochs=8", "--qat_epochs=1", "--latency_runs=60",
                        "--variants=float,int8,qat_int8,keras3_int8,keras3_int4",
                        env={"PYTHONPATH": TESTS_DIR})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    rows = {row["variant"]: row for row in report["variants"]}
    assert list(rows) == ["float", "int8", "qat_int8", "keras3_int8", "keras3_int4"]
    assert report["float_keras_accuracy"] > 0.9
    for name in ("keras3_int8", "keras3_int4"):
        assert report[f"{name}_quantized_layers"] == ["dense", "head"]  # convolutions stay float
        assert abs(rows[name]["accuracy_change_points"]) <= 3.0
        assert rows[name]["latency_p50_us"] > 0 and rows[name]["agreement_with_float"] >= 0.95
    int4, int8 = rows["keras3_int4"], rows["keras3_int8"]
    assert int4["runtime"] == "tflite" and os.path.getsize(int4["path"]) == int4["bytes"]
    assert int4["agreement_with_source"] == 1.0  # the file predicts what the Keras copy does
    assert int4["gzip_ratio"] > 2
    # int8 has no TFLite form: measured in Keras, labelled so, its quantized model kept.
    assert int8["runtime"] == "keras" and "runs in Keras" in int8["description"]
    assert int8["bytes"] < rows["float"]["bytes"] / 2
    assert report["float_keras_latency_p50_us"] > 0
    assert int8["speedup_vs_float_keras"] == pytest.approx(
        report["float_keras_latency_p50_us"] / int8["latency_p50_us"])
    saved = load_model_file(int8["path"])  # compiled with the recipe's tfaccel schedule
    assert saved.get_layer("dense").quantization_mode == "int8"
    markdown = (out / "report.md").read_text()
    assert "| keras3_int8 | keras |" in markdown and "| keras3_int4 | tflite |" in markdown
