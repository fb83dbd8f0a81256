"""tfaccel.compress.keras3_quantize: Keras 3's own quantization of the issue-17 model (Conv2D,
BatchNorm, DepthwiseConv2D, residual Add, pooling, Dropout, Dense) as measured variants."""

import os

import keras as keras3
import numpy as np
import pytest
from conftest import digits_arrays
from user_models_keras3 import residual_cnn

import tfaccel
from tfaccel import errors
from tfaccel.compress import keras3_quantize, tflite_eval
from tfaccel.keras import keras

QUANTIZABLE = ("dense", "head")  # Keras 3.15 quantizes Dense layers; convolutions stay float


@pytest.fixture(scope="module")
def trained():
    """The residual CNN trained briefly on digits: (model, splits, test arrays, float accuracy)."""
    splits = tfaccel.load_dataset("digits")
    (x, y), test = digits_arrays(splits.train), digits_arrays(splits.test)
    keras3.utils.set_random_seed(0)
    model = residual_cnn((8, 8, 1), 10)
    model.compile(keras3.optimizers.Adam(2e-3), "sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=64, epochs=8, verbose=0)
    return model, splits, test, accuracy(model, test)


def accuracy(model, test):
    x, y = test
    return float(np.mean(model.predict(x, verbose=0).argmax(-1) == y))


def stored_weights(layer):
    """A layer's variables as stored, by short name (`layer.kernel` of int4 unpacks them)."""
    return {v.path.rpartition("/")[2]: v for v in layer.weights}


def snapshot(model):
    return [np.array(w) for w in model.get_weights()]


def test_int8_copy_holds_int8_kernels_keeps_accuracy_and_leaves_the_model_alone(trained):
    model, _, test, float_accuracy = trained
    before = snapshot(model)
    assert float_accuracy > 0.9  # trained: the comparison below means something
    small = keras3_quantize.keras3_quantized(model, "int8")
    assert small is not model
    for name in QUANTIZABLE:
        layer = small.get_layer(name)
        assert layer.quantization_mode == "int8"
        assert layer.kernel.dtype == "int8"
        assert model.get_layer(name).kernel.dtype == "float32"  # the original is float still
    for name in ("conv_0", "depthwise", "conv_1"):
        assert small.get_layer(name).kernel.dtype == "float32"
    counted = keras3_quantize.quantized_weights(small, model)
    kernels = sum(int(np.prod(model.get_layer(n).kernel.shape)) for n in QUANTIZABLE)
    assert counted["layers"] == list(QUANTIZABLE)
    assert counted["quantized_weights"] == kernels
    assert counted["weights"] == sum(w.size for w in before)
    assert 0.5 < counted["share"] < 1.0
    assert abs(accuracy(small, test) - float_accuracy) <= 0.02
    for old, new in zip(before, model.get_weights()):
        np.testing.assert_array_equal(old, new)


def test_int8_has_no_tflite_form_and_is_sized_by_its_variables(trained, tmp_path):
    model, _, _, _ = trained
    path = tmp_path / "keras3_int8.tflite"
    variant = keras3_quantize.keras3_variant(model, "int8", str(path))
    assert variant.runtime == "keras" and variant.path is None
    assert variant.reason.startswith("TFLite conversion of Keras 3 model")
    assert "loc(" not in variant.reason  # the converter's complaint, not its MLIR location
    assert not path.exists() and os.listdir(tmp_path) == []  # no half-written file
    float_size = keras3_quantize.keras_weight_sizes(model)
    int8_size = keras3_quantize.keras_weight_sizes(variant.model)
    assert float_size["bytes"] == 4 * variant.quantized["weights"]
    # Each quantized kernel value drops from 4 bytes to 1; one float32 scale per output unit.
    units = sum(model.get_layer(n).units for n in QUANTIZABLE)
    assert int8_size["bytes"] == float_size["bytes"] - 3 * variant.quantized["quantized_weights"] \
        + 4 * units
    assert int8_size["gzip_bytes"] < float_size["gzip_bytes"] / 2


@pytest.mark.parametrize("mode", ["int4", "int4_per_channel"])
def test_int4_converts_to_a_tflite_that_predicts_what_the_keras_copy_does(trained, tmp_path,
                                                                          mode):
    model, _, test, float_accuracy = trained
    variant = keras3_quantize.keras3_variant(model, mode, str(tmp_path / f"{mode}.tflite"))
    assert variant.runtime == "tflite" and variant.reason is None
    dense = variant.model.get_layer("dense")
    assert dense.quantization_mode == "int4"
    stored = stored_weights(dense)
    assert stored["kernel"].dtype == "int8" and stored["kernel"].shape == (512, 32)  # 2 a byte
    assert dense.kernel.shape == (512, 64)  # as Keras unpacks it
    keras_scores = variant.model.predict(test[0], verbose=0)
    tflite_scores = tflite_eval.predict_tflite(variant.path, test[0])
    np.testing.assert_allclose(tflite_scores, keras_scores, atol=1e-5)
    assert abs(accuracy(variant.model, test) - float_accuracy) <= 0.03
    sizes = tflite_eval.tflite_sizes(variant.path)
    float_tflite = keras3_quantize.keras3_to_tflite(model, str(tmp_path / "float.tflite"))
    assert sizes["gzip_bytes"] < tflite_eval.tflite_sizes(float_tflite)["gzip_bytes"] / 2


def test_keras_latency_is_measured_for_each_model(trained):
    model, _, _, _ = trained
    small = keras3_quantize.keras3_quantized(model, "int8")
    latency = keras3_quantize.compare_keras_latency({"float": model, "int8": small},
                                                    num_runs=20, warmup=2, rounds=2)
    assert sorted(latency) == ["float", "int8"]
    for stats in latency.values():
        assert set(stats) == {"mean_us", "p50_us", "p90_us", "num_runs"}
        assert stats["num_runs"] == 20
        assert 0 < stats["p50_us"] <= stats["p90_us"]
    with pytest.raises(errors.ConfigError, match="num_runs=0"):
        keras3_quantize.compare_keras_latency({"float": model}, num_runs=0)


@pytest.fixture
def keras_gptq_fixed(monkeypatch):
    """Keras' GPTQ as keras-team/keras#23512 fixes it: a Dense layer being calibrated runs the
    `call` GPTQ hooked (3.15.1 runs `quantized_call`, so the hook never sees an input)."""
    from keras.src.layers.core.dense import Dense

    original = Dense._gptq_call

    def calibrating_call(self, inputs, training=False):
        hook = vars(self).get("call")  # set on the instance while GPTQ calibrates
        if not self.is_gptq_calibrated and hook is not None:
            return hook(inputs)
        return original(self, inputs, training)

    monkeypatch.setattr(Dense, "_gptq_call", calibrating_call)
    keras3_quantize.gptq_calibrates.cache_clear()
    yield
    keras3_quantize.gptq_calibrates.cache_clear()  # before the patch goes: probe again after


def test_gptq_is_refused_where_keras_gptq_is_plain_rounding(trained):
    model, splits, _, _ = trained
    assert keras3.__version__.startswith("3.15.")  # the range pinned in pyproject.toml
    assert keras3_quantize.gptq_calibrates() is False
    with pytest.raises(errors.ModelError, match=r"does not calibrate.*#23512.*use mode 'int4'"):
        keras3_quantize.keras3_quantized(model, "gptq", calibration=splits.train)


def test_the_gptq_probe_sees_a_gptq_that_calibrates(keras_gptq_fixed):
    assert keras3_quantize.gptq_calibrates() is True


@pytest.mark.slow  # Keras' GPTQ on TensorFlow: ~20 s of eager slice updates for this model
def test_gptq_that_calibrates_runs_on_a_classifier_without_downloads(trained, tmp_path,
                                                                     keras_gptq_fixed):
    model, splits, test, float_accuracy = trained
    variant = keras3_quantize.keras3_variant(model, "gptq", str(tmp_path / "gptq.tflite"),
                                             calibration=splits.train)
    assert variant.model.get_layer("dense").quantization_mode == "gptq"
    assert variant.quantized["layers"] == list(QUANTIZABLE)
    # The Hessians moved weights off plain rounding's grid points: the dense outputs differ.
    rounded = keras3_quantize.keras3_quantized(model, "int4")
    features = [keras3.Model(m.inputs, m.get_layer("dense").output).predict(test[0], verbose=0)
                for m in (variant.model, rounded)]
    assert np.abs(features[0] - features[1]).max() > 1e-3
    assert abs(accuracy(variant.model, test) - float_accuracy) <= 0.03
    assert variant.runtime == "tflite"
    np.testing.assert_allclose(tflite_eval.predict_tflite(variant.path, test[0]),
                               variant.model.predict(test[0], verbose=0), atol=1e-5)


def test_bad_inputs_get_one_clear_error(trained):
    model, _, _, _ = trained
    with pytest.raises(errors.ConfigError, match="'int2'.*int8, int4, int4_per_channel, gptq"):
        keras3_quantize.keras3_quantized(model, "int2")
    with pytest.raises(errors.ConfigError, match="calibration="):
        keras3_quantize.keras3_quantized(model, "gptq")
    old = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="legacy")
    with pytest.raises(errors.ModelError, match=r"'legacy' is a tf_keras model.*to_keras3"):
        keras3_quantize.keras3_quantized(old, "int8")
    twice = keras3_quantize.keras3_quantized(model, "int8")
    with pytest.raises(errors.ModelError, match="cannot"):
        keras3_quantize.keras3_quantized(twice, "int4")


BERT_INT8_TOLERANCE, BERT_INT4_TOLERANCE = 0.02, 0.1  # of the float logits' largest magnitude


@pytest.mark.slow
def test_keras_hub_bert_and_gpt2_quantize_inside_their_transformer_layers():
    from hub_models import gpt2_and_bert

    keras3.utils.set_random_seed(0)
    gpt2, bert = gpt2_and_bert()
    ids = np.random.default_rng(0).integers(1, 100, (128, 16))
    x = {"token_ids": ids, "segment_ids": np.zeros_like(ids),
         "padding_mask": np.ones_like(ids, bool)}
    bert.compile(keras3.optimizers.Adam(1e-3),
                 loss=keras3.losses.SparseCategoricalCrossentropy(from_logits=True))
    bert.fit(x, (ids < 50).sum(1) > 8, batch_size=32, epochs=2, verbose=0)  # logits apart
    logits = np.asarray(bert.predict(x, verbose=0))
    for mode, tolerance in (("int8", BERT_INT8_TOLERANCE), ("int4", BERT_INT4_TOLERANCE)):
        small = keras3_quantize.keras3_quantized(bert, mode)
        assert type(small).__name__ == "BertTextClassifier"
        assert "transformer_layer_0/feedforward_intermediate_dense" in \
            keras3_quantize.quantized_weights(small, bert)["layers"]
        diff = np.abs(np.asarray(small.predict(x, verbose=0)) - logits).max()
        assert diff <= tolerance * np.abs(logits).max(), (mode, diff)
        assert keras3_quantize.keras_weight_sizes(small)["bytes"] < \
            0.5 * keras3_quantize.keras_weight_sizes(bert)["bytes"]
    counted = keras3_quantize.quantized_weights(keras3_quantize.keras3_quantized(gpt2, "int8"),
                                                gpt2)
    assert {"transformer_layer_0/self_attention/query", "token_embedding"} <= \
        set(counted["layers"])
    assert counted["share"] > 0.9  # the kernels and the (tied) embedding: nearly every weight
