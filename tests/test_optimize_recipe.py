"""recipes/optimize.py end to end: bad input fails early and cleanly; a short run writes the report."""

import json
import os

import numpy as np
import pytest
from conftest import run_recipe

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
    result = run_recipe("optimize", f"--model_dir={out}", "--variants=float,int4")
    line = _one_error_line(result)
    assert "int4" in line and "qat_int8" in line
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
    text = summaries.read_text(logdir)
    assert "| pruned_qat_int8 |" in text["report/table"] and "config/flags" in text
    assert "report/accuracy_vs_size" in summaries.read_image_tags(logdir)
    scalars = summaries.read_scalars(logdir)
    assert scalars["accuracy/int8"][-1][1] == pytest.approx(rows["int8"]["accuracy"], abs=1e-6)
