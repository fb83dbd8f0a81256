"""compress.tflite: conversion modes, evaluation with int8 scales, latency, sizes, agreement."""

import os

import numpy as np
import pytest

from tfaccel import data, errors
from tfaccel.compress import tflite
from tfaccel.keras import keras
from tfaccel.train import models, training


@pytest.fixture(scope="module")
def trained():
    """A digits CNN trained briefly, its test split as arrays, and its Keras predictions."""
    keras.utils.set_random_seed(0)
    splits = data.load_dataset("digits")
    model = models.build_model("cnn", splits.info.input_shape, splits.info.num_classes)
    training.compile_classifier(model, training.make_optimizer("adam", 2e-3))
    model.fit(data.batch_dataset(splits.train, 64, training=True), epochs=4, verbose=0)
    x, y = (np.concatenate(a) for a in zip(*data.batch_dataset(
        splits.test, 512, training=False).as_numpy_iterator()))
    return splits, model, x, y, model.predict(x, verbose=0).argmax(-1)


@pytest.fixture(scope="module")
def files(trained, tmp_path_factory):
    splits, model, *_ = trained
    out = tmp_path_factory.mktemp("tflite")
    return {mode: tflite.convert_to_tflite(model, str(out / f"{mode}.tflite"), mode=mode,
                                           representative_data=splits.train,
                                           num_calibration_samples=100)
            for mode in ("float", "int8")}


def test_float_file_matches_keras(trained, files):
    _, _, x, y, keras_pred = trained
    result = tflite.evaluate_tflite(files["float"], (x, y), progress=False)
    assert result["num_examples"] == len(y) == 360
    assert tflite.prediction_agreement(result["predictions"], keras_pred) == 1.0
    assert result["accuracy"] == pytest.approx(np.mean(keras_pred == y))
    assert result["accuracy"] > 0.85


def test_int8_file_has_int8_io_and_keeps_accuracy(trained, files):
    _, _, x, y, keras_pred = trained
    interpreter = tflite.make_interpreter(files["int8"])
    assert interpreter.get_input_details()[0]["dtype"] == np.int8
    assert interpreter.get_output_details()[0]["dtype"] == np.int8
    scale, _ = interpreter.get_input_details()[0]["quantization"]
    assert scale > 0
    result = tflite.evaluate_tflite(files["int8"], (x, y), progress=False)
    assert result["accuracy"] >= np.mean(keras_pred == y) - 0.02
    assert tflite.prediction_agreement(result["predictions"], keras_pred) >= 0.97


def test_int8_inputs_are_quantized_with_the_input_scale(files, trained):
    _, _, x, _, _ = trained
    detail = tflite.make_interpreter(files["int8"]).get_input_details()[0]
    scale, zero_point = detail["quantization"]
    q = tflite._to_input(x[:8], detail)
    assert q.dtype == np.int8
    np.testing.assert_allclose((q.astype(np.float32) - zero_point) * scale, x[:8], atol=scale)


def test_quantized_files_are_smaller(files):
    sizes = {mode: tflite.tflite_sizes(path) for mode, path in files.items()}
    assert sizes["int8"]["bytes"] < sizes["float"]["bytes"] / 3
    assert all(0 < s["gzip_bytes"] <= s["bytes"] * 1.01 for s in sizes.values())
    assert sizes["float"]["bytes"] == os.path.getsize(files["float"])


def test_batched_and_unbatched_datasets_score_alike(trained, files):
    splits, *_ = trained
    unbatched = tflite.evaluate_tflite(files["int8"], splits.test, progress=False)
    batched = tflite.evaluate_tflite(files["int8"],
                                     data.batch_dataset(splits.test, 64, training=False),
                                     batch_size=100, progress=False)
    assert unbatched["num_examples"] == batched["num_examples"] == 360
    np.testing.assert_array_equal(unbatched["predictions"], batched["predictions"])


def test_latency_is_measured_for_each_model(files):
    one = tflite.measure_latency(files["float"], num_runs=30, warmup=5)
    assert 0 < one["p50_us"] <= one["p90_us"] and one["num_runs"] == 30
    both = tflite.compare_latency({"float": files["float"], "int8": files["int8"]},
                                  num_runs=40, warmup=5, rounds=4)
    assert set(both) == {"float", "int8"}
    assert all(v["num_runs"] == 40 and v["mean_us"] > 0 for v in both.values())
    with pytest.raises(errors.ConfigError, match="num_runs"):
        tflite.measure_latency(files["float"], num_runs=0)


def test_weight_sparsity_counts_zeros_in_the_file(trained, tmp_path):
    _, model, *_ = trained
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    kernel = clone.get_layer("dense").kernel
    values = kernel.numpy()
    values[: values.shape[0] // 2] = 0.0
    kernel.assign(values)
    path = tflite.convert_to_tflite(clone, str(tmp_path / "half.tflite"), mode="dynamic")
    measured = tflite.weight_sparsity(path)
    dense = [v for k, v in measured["tensors"].items() if "dense" in k and "MatMul" in k]
    assert dense and dense[0] == pytest.approx(0.5, abs=0.01)
    assert measured["zeros"] >= values.size // 2
    assert measured["sparsity"] == pytest.approx(measured["zeros"] / measured["weights"])


def test_agreement():
    assert tflite.prediction_agreement([0, 1, 2, 3], [0, 1, 2, 0]) == 0.75
    scores = np.eye(3)[[0, 2, 1]]
    assert tflite.prediction_agreement(scores, [0, 2, 2]) == pytest.approx(2 / 3)
    with pytest.raises(errors.DataError, match="shapes"):
        tflite.prediction_agreement([0, 1], [0, 1, 2])


def test_bad_requests_fail_before_writing(trained, tmp_path):
    _, model, *_ = trained
    with pytest.raises(errors.ConfigError, match="unknown TFLite mode 'int4'"):
        tflite.convert_to_tflite(model, str(tmp_path / "a.tflite"), mode="int4")
    with pytest.raises(errors.ConfigError, match="representative_data"):
        tflite.convert_to_tflite(model, str(tmp_path / "b.tflite"), mode="int8")
    assert os.listdir(tmp_path) == []
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a flatbuffer")
    with pytest.raises(errors.ModelError, match="bad.tflite"):
        tflite.make_interpreter(str(bad))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dynamic", "float16", "int16x8"])
def test_other_modes(trained, files, tmp_path, mode):
    splits, model, x, y, keras_pred = trained
    float_path = files["float"]
    path = tflite.convert_to_tflite(model, str(tmp_path / f"{mode}.tflite"), mode=mode,
                                    representative_data=splits.train, num_calibration_samples=50)
    ratio = tflite.tflite_sizes(path)["bytes"] / tflite.tflite_sizes(float_path)["bytes"]
    assert ratio < {"dynamic": 0.3, "float16": 0.55, "int16x8": 0.35}[mode]
    result = tflite.evaluate_tflite(path, (x, y), progress=False)
    assert tflite.prediction_agreement(result["predictions"], keras_pred) >= 0.98


def test_weight_sparsity_of_named_layers_reads_their_int8_weights(tmp_path):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv")(inputs)
    x = keras.layers.Flatten(name="flat")(x)
    x = keras.layers.Dense(32, activation="relu", name="hidden")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(x)
    model = keras.Model(inputs, outputs)
    kernel = model.get_layer("hidden").kernel
    values = kernel.numpy()
    values[np.abs(values) < np.quantile(np.abs(values), 0.8)] = 0.0
    kernel.assign(values)
    x = np.random.default_rng(0).random((64, 8, 8, 1), dtype=np.float32)
    path = tflite.convert_to_tflite(model, str(tmp_path / "m.tflite"), mode="int8",
                                    representative_data=x, num_calibration_samples=64)
    result = tflite.weight_sparsity(path, layer_names=["hidden", "conv"])
    assert set(result["layers"]) == {"hidden", "conv"}
    assert result["layers"]["hidden"] == pytest.approx(0.8, abs=0.002)
    assert result["layers"]["conv"] < 0.05  # 72 int8 weights: a few may round to zero
    assert result["weights"] == 512 * 32 + 72
    with pytest.raises(errors.ModelError, match="no weights of layers nope"):
        tflite.weight_sparsity(path, layer_names=["hidden", "nope"])
