"""compress.tflite_eval: accuracy with int8 scales, batched or not, latency, weight sparsity
read from the file, agreement, unreadable files."""

import numpy as np
import pytest

from tfaccel import data, errors
from tfaccel.compress import tflite, tflite_eval
from tfaccel.keras import keras


def test_float_file_matches_keras(trained, files):
    _, _, x, y, keras_pred = trained
    result = tflite_eval.evaluate_tflite(files["float"], (x, y), progress=False)
    assert result["num_examples"] == len(y) == 360
    assert tflite_eval.prediction_agreement(result["predictions"], keras_pred) == 1.0
    assert result["accuracy"] == pytest.approx(np.mean(keras_pred == y))
    assert result["accuracy"] > 0.85


def test_int8_inputs_are_quantized_with_the_input_scale(files, trained):
    _, _, x, _, _ = trained
    detail = tflite_eval.make_interpreter(files["int8"]).get_input_details()[0]
    scale, zero_point = detail["quantization"]
    q = tflite_eval._to_input(x[:8], detail)
    assert q.dtype == np.int8
    np.testing.assert_allclose((q.astype(np.float32) - zero_point) * scale, x[:8], atol=scale)


def test_batched_and_unbatched_datasets_score_alike(trained, files):
    splits, *_ = trained
    unbatched = tflite_eval.evaluate_tflite(files["int8"], splits.test, progress=False)
    batched = tflite_eval.evaluate_tflite(files["int8"],
                                     data.batch_dataset(splits.test, 64, training=False),
                                     batch_size=100, progress=False)
    assert unbatched["num_examples"] == batched["num_examples"] == 360
    np.testing.assert_array_equal(unbatched["predictions"], batched["predictions"])


def test_latency_is_measured_for_each_model(files):
    one = tflite_eval.measure_latency(files["float"], num_runs=30, warmup=5)
    assert set(one) == {"mean_us", "p50_us", "p90_us", "num_runs", "num_threads"}
    assert 0 < one["p50_us"] <= one["p90_us"] and one["num_runs"] == 30
    assert one["num_threads"] == 1
    both = tflite_eval.compare_latency({"float": files["float"], "int8": files["int8"]},
                                  num_runs=40, warmup=5, rounds=4)
    assert set(both) == {"float", "int8"}
    assert all(v["num_runs"] == 40 and v["mean_us"] > 0 for v in both.values())
    with pytest.raises(errors.ConfigError, match="num_runs"):
        tflite_eval.measure_latency(files["float"], num_runs=0)


def test_weight_sparsity_counts_zeros_in_the_file(trained, tmp_path):
    _, model, *_ = trained
    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    kernel = clone.get_layer("dense").kernel
    values = kernel.numpy()
    values[: values.shape[0] // 2] = 0.0
    kernel.assign(values)
    path = tflite.convert_to_tflite(clone, str(tmp_path / "half.tflite"), mode="dynamic")
    measured = tflite_eval.weight_sparsity(path)
    dense = [v for k, v in measured["tensors"].items() if "dense" in k and "MatMul" in k]
    assert dense and dense[0] == pytest.approx(0.5, abs=0.01)
    assert measured["zeros"] >= values.size // 2
    assert measured["sparsity"] == pytest.approx(measured["zeros"] / measured["weights"])


def test_agreement():
    assert tflite_eval.prediction_agreement([0, 1, 2, 3], [0, 1, 2, 0]) == 0.75
    scores = np.eye(3)[[0, 2, 1]]
    assert tflite_eval.prediction_agreement(scores, [0, 2, 2]) == pytest.approx(2 / 3)
    with pytest.raises(errors.DataError, match="shapes"):
        tflite_eval.prediction_agreement([0, 1], [0, 1, 2])


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
    result = tflite_eval.weight_sparsity(path, layer_names=["hidden", "conv"])
    assert set(result["layers"]) == {"hidden", "conv"}
    assert result["layers"]["hidden"] == pytest.approx(0.8, abs=0.002)
    assert result["layers"]["conv"] < 0.05  # 72 int8 weights: a few may round to zero
    assert result["weights"] == 512 * 32 + 72
    with pytest.raises(errors.ModelError, match="no weights of layers nope"):
        tflite_eval.weight_sparsity(path, layer_names=["hidden", "nope"])


def test_a_file_that_is_not_tflite_is_one_clear_line(tmp_path):
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a flatbuffer")
    with pytest.raises(errors.ModelError, match="cannot load TFLite model .*bad.tflite") as info:
        tflite_eval.make_interpreter(str(bad))
    assert "\n" not in str(info.value)
