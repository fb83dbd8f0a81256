"""compress.tflite: conversion modes, calibration data, the files' sizes and accuracy, bad requests.

The trained digits CNN (`trained`) and its float and int8 files (`files`) are conftest fixtures,
shared with tests/test_tflite_eval.py."""

import os

import numpy as np
import pytest

from tfaccel import data, errors
from tfaccel.compress import tflite, tflite_eval
from tfaccel.errors import ConfigError


def test_int8_file_has_int8_io_and_keeps_accuracy(trained, files):
    _, _, x, y, keras_pred = trained
    interpreter = tflite_eval.make_interpreter(files["int8"])
    assert interpreter.get_input_details()[0]["dtype"] == np.int8
    assert interpreter.get_output_details()[0]["dtype"] == np.int8
    scale, _ = interpreter.get_input_details()[0]["quantization"]
    assert scale > 0
    result = tflite_eval.evaluate_tflite(files["int8"], (x, y), progress=False)
    assert result["accuracy"] >= np.mean(keras_pred == y) - 0.02
    assert tflite_eval.prediction_agreement(result["predictions"], keras_pred) >= 0.97


def test_quantized_files_are_smaller(files):
    sizes = {mode: tflite_eval.tflite_sizes(path) for mode, path in files.items()}
    assert sizes["int8"]["bytes"] < sizes["float"]["bytes"] / 3
    assert all(0 < s["gzip_bytes"] <= s["bytes"] * 1.01 for s in sizes.values())
    assert sizes["float"]["bytes"] == os.path.getsize(files["float"])


def test_bad_requests_fail_before_writing(trained, tmp_path):
    _, model, *_ = trained
    with pytest.raises(errors.ConfigError, match="unknown TFLite mode 'int4'"):
        tflite.convert_to_tflite(model, str(tmp_path / "a.tflite"), mode="int4")
    with pytest.raises(errors.ConfigError, match="representative_data"):
        tflite.convert_to_tflite(model, str(tmp_path / "b.tflite"), mode="int8")
    assert os.listdir(tmp_path) == []


class _Converter:
    def __init__(self, error=None):
        self.error = error

    def convert(self):
        if self.error:
            raise self.error
        return b"flatbuffer"


def test_a_conversion_is_written_whole_or_fails_in_one_line(tmp_path):
    path = str(tmp_path / "m.tflite")
    assert tflite.write_converted(_Converter(), path, "x", "y") == path
    assert open(path, "rb").read() == b"flatbuffer"
    error = ValueError("'tf.Foo' op is neither a custom op nor a flex op\n<stack>")
    with pytest.raises(errors.ModelError) as raised:
        tflite.write_converted(_Converter(error), str(tmp_path / "n.tflite"),
                               "'cnn' in mode 'int8'", "try mode='float'")
    assert str(raised.value) == ("TFLite conversion of 'cnn' in mode 'int8' failed: 'tf.Foo' op "
                                 "is neither a custom op nor a flex op; try mode='float'")
    assert sorted(os.listdir(tmp_path)) == ["m.tflite"]  # nothing half-written


def test_representative_data_is_single_examples_from_any_form(trained):
    splits, _, x, _, _ = trained
    batched = data.batch_dataset(splits.train, 64, training=False)
    assert tflite.is_batched(batched.element_spec[0])
    assert not tflite.is_batched(splits.train.element_spec[0])
    for source in (splits.train, batched, x):
        examples = list(tflite.representative_dataset(source, num_samples=70)())
        assert len(examples) == 70
        assert all(len(e) == 1 and e[0].shape == (1, *x.shape[1:]) and e[0].dtype == np.float32
                   for e in examples)
    np.testing.assert_array_equal(
        next(tflite.representative_dataset(x, 1)())[0][0], x[0])
    with pytest.raises(errors.DataError, match="representative data is empty"):
        tflite.representative_dataset(x[:0])
    with pytest.raises(errors.ConfigError, match="num_samples=0"):
        tflite.representative_dataset(x, num_samples=0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dynamic", "float16", "int16x8"])
def test_other_modes(trained, files, tmp_path, mode):
    splits, model, x, y, keras_pred = trained
    float_path = files["float"]
    path = tflite.convert_to_tflite(model, str(tmp_path / f"{mode}.tflite"), mode=mode,
                                    representative_data=splits.train, num_calibration_samples=50)
    ratio = tflite_eval.tflite_sizes(path)["bytes"] / tflite_eval.tflite_sizes(float_path)["bytes"]
    assert ratio < {"dynamic": 0.3, "float16": 0.55, "int16x8": 0.35}[mode]
    result = tflite_eval.evaluate_tflite(path, (x, y), progress=False)
    assert tflite_eval.prediction_agreement(result["predictions"], keras_pred) >= 0.98




def _keras3_model_with_a_custom_layer():
    from tfaccel.keras import keras3

    k3 = keras3()

    class Doubler(k3.layers.Layer):
        def call(self, x):
            return 2.0 * x

    inputs = k3.Input((8, 8, 1))
    x = k3.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = k3.layers.Flatten()(Doubler()(x))
    return k3.Model(inputs, k3.layers.Dense(10)(x))


@pytest.mark.parametrize("mode, tolerance", [("float", 1e-5), ("dynamic", 0.05),
                                             ("int8", 0.1), ("float16", 0.01)])
def test_a_keras3_model_with_a_custom_layer_converts_without_the_bridge(tmp_path, mode,
                                                                       tolerance):
    model = _keras3_model_with_a_custom_layer()
    data = np.random.default_rng(0).random((40, 8, 8, 1), dtype=np.float32)
    path = tflite.convert_to_tflite(model, str(tmp_path / f"{mode}.tflite"), mode=mode,
                                    representative_data=data)
    predicted = tflite_eval.predict_tflite(path, data[:8])
    expected = np.asarray(model(data[:8]))
    assert predicted.shape == expected.shape
    scale = np.abs(expected).max()
    assert np.abs(predicted - expected).max() <= tolerance * max(scale, 1.0)


@pytest.mark.slow
def test_a_kerashub_causal_lm_converts_at_a_chosen_length(tmp_path):
    keras_hub = pytest.importorskip("keras_hub")
    from ai_edge_litert.interpreter import Interpreter

    model = keras_hub.models.GPT2CausalLM(backbone=keras_hub.models.GPT2Backbone(
        vocabulary_size=100, num_layers=1, num_heads=2, hidden_dim=32, intermediate_dim=64,
        max_sequence_length=32), preprocessor=None)
    with pytest.raises(ConfigError, match="variable length.*sequence_length="):
        tflite.convert_to_tflite(model, str(tmp_path / "lm.tflite"))
    assert not (tmp_path / "lm.tflite").exists()
    path = tflite.convert_to_tflite(model, str(tmp_path / "lm.tflite"), sequence_length=12)
    feeds = {"token_ids": (np.arange(12) * 7 % 100).astype(np.int32)[None],
             "padding_mask": np.ones((1, 12), np.int32)}
    interpreter = Interpreter(model_path=path)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        assert list(detail["shape"]) == [1, 12]
        key = "token_ids" if "token_ids" in detail["name"] else "padding_mask"
        interpreter.set_tensor(detail["index"], feeds[key])
    interpreter.invoke()
    logits = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    np.testing.assert_allclose(logits, np.asarray(model(feeds)), atol=1e-4)


def _two_input_model(flavour="keras3"):
    """Inputs of very different ranges ('small' in [0, 1), 'large' in [-40, 40)): each must be
    calibrated on its own values."""
    from conftest import keras_of_flavour

    k3 = keras_of_flavour(flavour)
    k3.utils.set_random_seed(0)
    small, large = k3.Input((6,), name="small"), k3.Input((6,), name="large")
    h = k3.layers.Concatenate()([k3.layers.Dense(8, activation="relu")(small),
                                 k3.layers.Dense(8, activation="relu")(large)])
    return k3.Model([small, large], k3.layers.Dense(3)(h), name="two_inputs")


def _two_inputs(n=64):
    rng = np.random.default_rng(0)
    return {"small": rng.random((n, 6), dtype=np.float32),
            "large": (rng.random((n, 6), dtype=np.float32) - 0.5) * 80}


def _signature_predictions(path, feeds):
    """The file's outputs for `feeds` ({input name: examples}), one example per call through
    its signature (quantized inputs and outputs converted)."""
    runner = tflite_eval.make_interpreter(path).get_signature_runner()
    inputs, outputs = runner.get_input_details(), runner.get_output_details()
    rows = []
    for i in range(len(next(iter(feeds.values())))):
        (name, y), = runner(**{k: tflite_eval._to_input(x[i:i + 1], inputs[k])
                               for k, x in feeds.items()}).items()
        rows.append(tflite_eval._from_output(y, outputs[name]))
    return np.concatenate(rows)


@pytest.mark.parametrize("flavour, form", [("keras3", "dict"), ("keras3", "tuple"),
                                           ("tf_keras", "dict")])
def test_a_two_input_model_calibrates_on_named_inputs_and_matches_keras(tmp_path, flavour,
                                                                        form):
    """Full int8 calibrated from a dict {input name: examples} (or a tuple in the model's input
    order): the file runs and its outputs are within 3% of the largest |output| of Keras's
    (measured on Keras 3: 0.9%, 0.29 of 31.7)."""
    model, data = _two_input_model(flavour), _two_inputs()
    calibration = data if form == "dict" else (data["small"], data["large"])
    path = tflite.convert_to_tflite(model, str(tmp_path / "two.tflite"), mode="int8",
                                    representative_data=calibration)
    test = {name: x[:16] for name, x in data.items()}
    expected = np.asarray(model(test))
    predicted = _signature_predictions(path, test)
    assert predicted.shape == expected.shape == (16, 3)
    assert np.abs(predicted - expected).max() <= 0.03 * np.abs(expected).max()


def test_calibration_examples_are_dicts_keyed_by_the_signature_names():
    import tensorflow as tf

    specs = [tf.TensorSpec(None, tf.float32, name="small"),
             tf.TensorSpec(None, tf.int32, name="ids")]
    data = {"ids": np.arange(10).reshape(5, 2), "small": np.ones((5, 6), np.float64)}
    examples = list(tflite.representative_dataset(data, 3, inputs=specs)())
    assert len(examples) == 3 and [sorted(e) for e in examples] == [["ids", "small"]] * 3
    assert examples[1]["ids"].dtype == np.int32 and examples[1]["small"].dtype == np.float32
    np.testing.assert_array_equal(examples[1]["ids"], [[2, 3]])
    by_order = list(tflite.representative_dataset((data["small"], data["ids"]), 5, specs)())
    np.testing.assert_array_equal(by_order[4]["ids"], [[8, 9]])
    labelled = tf.data.Dataset.from_tensor_slices((data, np.zeros(5))).batch(2)
    assert len(list(tflite.representative_dataset(labelled, 4, specs)())) == 4
    one = [tf.TensorSpec(None, tf.float32, name="image")]
    single = list(tflite.representative_dataset({"image": np.zeros((2, 4))}, 5, one)())
    assert len(single) == 2 and single[0][0].shape == (1, 4)  # one input: the list form


_MISMATCHED = {  # calibration data for _two_input_model that does not fit it
    "misspelt": lambda d: {"small": d["small"], "larg": d["large"]},
    "missing": lambda d: {"small": d["small"]},
    "three": lambda d: (d["small"],) * 3,
    "array": lambda d: d["small"],
    "short": lambda d: {**d, "large": d["large"][:10]},
}


@pytest.mark.parametrize("case, line", [
    ("misspelt", "calibration input 'larg' is not an input of the model (its inputs: small, "
     "large): key the arrays by those names"),
    ("missing", "calibration data has no 'large', an input of the model: give an array for "
     "each of small, large"),
    ("three", "calibration data has 3 arrays for a model of 2 inputs (small, large): give one "
     "array per input in that order, or a dict keyed by those names"),
    ("array", "calibration data is one array for a model of 2 inputs (small, large): give a "
     "dict keyed by those names, or a tuple of one array per input in that order"),
    ("short", "calibration inputs hold different numbers of examples (small: 64, large: 10): "
     "give every input the same examples along its first axis"),
])
def test_calibration_that_does_not_match_the_inputs_is_refused_in_one_line(tmp_path, case,
                                                                           line):
    with pytest.raises(ConfigError) as raised:
        tflite.convert_to_tflite(_two_input_model(), str(tmp_path / "m.tflite"),
                                 mode="int8",
                                 representative_data=_MISMATCHED[case](_two_inputs()))
    assert str(raised.value) == line
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_a_kerashub_bert_calibrates_full_int8_on_its_three_named_inputs(tmp_path):
    """KerasHub BERT (2 layers, random init, built from a config) to full int8, calibrated on
    a dict of token_ids, segment_ids and padding_mask: logits within 15% of the largest |logit|
    of Keras's (the own-model matrix's int8 tolerance)."""
    from hub_models import gpt2_and_bert

    _, bert = gpt2_and_bert(layers=2, max_length=16)
    rng = np.random.default_rng(0)
    data = {"token_ids": rng.integers(1, 100, (40, 16)).astype(np.int32),
            "segment_ids": (np.arange(16) >= 8).astype(np.int32)[None].repeat(40, 0),
            "padding_mask": (np.arange(16) < rng.integers(8, 17, (40, 1))).astype(np.int32)}
    path = tflite.convert_to_tflite(bert, str(tmp_path / "bert.tflite"), mode="int8",
                                    representative_data=data, sequence_length=16)
    test = {name: x[:6] for name, x in data.items()}
    expected = np.asarray(bert(test, training=False))
    predicted = _signature_predictions(path, test)
    assert predicted.shape == expected.shape == (6, 2)
    assert np.abs(predicted - expected).max() <= 0.15 * np.abs(expected).max()
