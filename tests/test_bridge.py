"""tfaccel.keras.bridge: Keras 3 <-> tf_keras, verified; Keras 3 models through TF-MOT (pruning,
QAT, int8 TFLite); TF-MOT's TF_USE_LEGACY_KERAS side effect contained."""

import dataclasses
import json
import os
import subprocess
import sys

import keras as keras3
import numpy as np
import pytest
import user_models_keras3
from conftest import digits_arrays

import tfaccel
from tfaccel import errors
from tfaccel.compress import prune, quantize, sparsity, tflite, tflite_eval
from tfaccel.keras import bridge, flavour_of, keras, translate
from tfaccel.train import training

L3 = keras3.layers
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def digits():
    splits = tfaccel.load_dataset("digits")
    return splits, digits_arrays(splits.train), digits_arrays(splits.test)


def residual_cnn():
    """The issue's model (tests/user_models_keras3.py) for 8x8x1 digits."""
    return user_models_keras3.residual_cnn((8, 8, 1), 10)


def with_batchnorm_statistics(model, seed=0):
    """Non-trivial moving means and variances, so that inference-mode BatchNorm matters."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if type(layer).__name__ == "BatchNormalization":
            layer.set_weights([rng.uniform(0.5, 1.5, w.shape).astype(np.float32)
                               for w in layer.get_weights()])
    return model


def weights_by_layer(model):
    return {layer.name: layer.get_weights() for layer in model.layers if layer.weights}


def assert_same_weights(a, b):
    wa, wb = weights_by_layer(a), weights_by_layer(b)
    assert sorted(wa) == sorted(wb)
    for name in wa:
        assert len(wa[name]) == len(wb[name])
        for x, y in zip(wa[name], wb[name]):
            np.testing.assert_array_equal(x, y, err_msg=name)


# ---------------------------------------------------------------- round trips


def test_round_trip_of_the_residual_cnn_keeps_predictions_and_weights(digits):
    _, _, (x_test, _) = digits
    model3 = with_batchnorm_statistics(residual_cnn())
    model2 = bridge.to_tf_keras(model3, sample=x_test)
    assert flavour_of(model2) == "tf_keras" and flavour_of(model3) == "keras3"
    assert [layer.name for layer in model2.layers] == [layer.name for layer in model3.layers]
    assert_same_weights(model3, model2)
    assert bridge.max_difference(model3, model2, x_test) <= 1e-5
    back = bridge.to_keras3(model2, sample=x_test)
    assert flavour_of(back) == "keras3"
    assert_same_weights(model3, back)
    assert bridge.max_difference(model3, back, x_test) <= 1e-5
    assert back.predict(x_test[:4], verbose=0).shape == (4, 10)  # one input, one output


STANDARD_LAYERS = {
    "conv1d": ((10, 3), lambda: L3.Conv1D(4, 3, strides=2, padding="same")),
    "conv2d_transpose": ((6, 6, 2), lambda: L3.Conv2DTranspose(3, 3, strides=2)),
    "separable_conv2d": ((6, 6, 2), lambda: L3.SeparableConv2D(3, 3, depth_multiplier=2)),
    "conv3d": ((4, 4, 4, 2), lambda: L3.Conv3D(2, 2)),
    "dense_regularized": ((5,), lambda: L3.Dense(3, kernel_regularizer="l2", activation="tanh")),
    "layer_norm": ((5,), lambda: L3.LayerNormalization()),
    "batch_norm_axis1": ((4, 5), lambda: L3.BatchNormalization(axis=1)),
    "group_norm": ((4, 4, 4), lambda: L3.GroupNormalization(2)),
    "average_pooling": ((6, 6, 2), lambda: L3.AveragePooling2D(2)),
    "global_max_pooling": ((6, 6, 2), lambda: L3.GlobalMaxPooling2D(keepdims=True)),
    "reshape": ((6,), lambda: L3.Reshape((2, 3))),
    "permute": ((2, 3), lambda: L3.Permute((2, 1))),
    "zero_padding": ((4, 4, 1), lambda: L3.ZeroPadding2D(1)),
    "cropping": ((4, 4, 1), lambda: L3.Cropping2D(1)),
    "upsampling": ((4, 4, 1), lambda: L3.UpSampling2D()),
    "resizing": ((4, 4, 1), lambda: L3.Resizing(6, 6)),
    "leaky_relu": ((5,), lambda: L3.LeakyReLU(0.2)),
    "prelu": ((5,), lambda: L3.PReLU()),
    "gelu": ((5,), lambda: L3.Activation("gelu")),
    "rescaling": ((5,), lambda: L3.Rescaling(2.0, offset=1.0)),
    "lstm": ((4, 3), lambda: L3.LSTM(5)),
    "gru_sequences": ((4, 3), lambda: L3.GRU(5, return_sequences=True)),
    "bidirectional": ((4, 3), lambda: L3.Bidirectional(L3.LSTM(2))),
    "time_distributed": ((3, 4), lambda: L3.TimeDistributed(L3.Dense(2))),
    "spatial_dropout": ((4, 4, 2), lambda: L3.SpatialDropout2D(0.3)),
    "embedding": (None, lambda: L3.Embedding(10, 3)),
}


@pytest.mark.parametrize("kind", sorted(STANDARD_LAYERS))
def test_standard_layers_cross_both_ways(kind):
    shape, make = STANDARD_LAYERS[kind]
    inputs = keras3.Input((4,), dtype="int32") if shape is None else keras3.Input(shape)
    model3 = keras3.Model(inputs, make()(inputs), name=kind)
    model2 = bridge.to_tf_keras(model3)
    back = bridge.to_keras3(model2)
    assert_same_weights(model3, back)
    sample = bridge.sample_inputs(model3, seed=1)
    assert bridge.max_difference(model3, model2, sample) <= 1e-5
    assert bridge.max_difference(model3, back, sample) <= 1e-5


def test_sequential_nested_models_shared_layers_and_two_inputs_cross():
    inner = keras3.Sequential([keras3.Input((4,)), L3.Dense(3, name="inner_dense")],
                              name="inner")
    a, b = keras3.Input((4,), name="a"), keras3.Input((4,), name="b")
    shared = L3.Dense(4, name="shared")
    joined = L3.Concatenate(name="join")([inner(shared(a)), shared(b)])
    model3 = keras3.Model([a, b], [joined, L3.Dense(1, name="score")(joined)], name="graph")
    sequential = keras3.Sequential([keras3.Input((6,)), L3.Dense(2), L3.Softmax()], name="seq")
    for model in (model3, sequential):
        model2 = bridge.to_tf_keras(model)
        assert isinstance(model2, keras.Sequential) == isinstance(model, keras3.Sequential)
        back = bridge.to_keras3(model2)
        assert bridge.max_difference(model, back) == 0.0
    outputs = back_outputs = bridge.to_keras3(bridge.to_tf_keras(model3))(
        bridge.sample_inputs(model3))
    assert len(back_outputs) == 2 and outputs[1].shape == (8, 1)


# ---------------------------------------------------------------- refusals


class Doubler(L3.Layer):
    def call(self, x):
        return 2 * x


def test_custom_layers_and_lambdas_are_listed_in_one_error():
    inputs = keras3.Input((4,))
    x = Doubler(name="my_doubler")(L3.Dense(3, name="dense")(inputs))
    x = L3.Lambda(lambda t: t + 1, name="plus_one")(x)
    model3 = keras3.Model(inputs, x * 3.0, name="custom")
    assert [name for name, _, _ in bridge.untranslatable_layers(model3)] == [
        "my_doubler", "plus_one", "multiply"]
    # prune_to_sparsity's default ("auto") prunes such a model without TF-MOT (test_magnitude).
    rebuild = ("keras.layers.Rescaling", "build the model in tf_keras")
    for call, fixes in ((bridge.to_tf_keras, rebuild),
                        (lambda m: prune.prune_to_sparsity(m, 0.5, 1, 1, method="tfmot"), rebuild),
                        (quantize.quantize_aware,  # what works for the model as it is
                         ("TF-MOT's limit", "tfaccel.keras3_quantized(model, 'int8')",
                          "mode='int8'"))):
        with pytest.raises(errors.UnsupportedLayerError) as info:
            call(model3)
        message = str(info.value)
        assert "\n" not in message
        for part in ("3 layer(s)", "my_doubler (Doubler: a custom layer class)",
                     "plus_one (Lambda", "multiply (Multiply: a raw operation", *fixes):
            assert part in message, part


def test_a_subclassed_model_gets_one_line():
    class Classifier(keras3.Model):
        def __init__(self):
            super().__init__(name="classifier")
            self.head = L3.Dense(2)

        def call(self, x):
            return self.head(x)

    model3 = Classifier()
    model3(np.zeros((1, 4), np.float32))
    with pytest.raises(errors.UnsupportedLayerError) as info:
        bridge.to_tf_keras(model3)
    message = str(info.value)
    assert "\n" not in message and "subclassed Classifier" in message
    assert "Sequential and functional" in message and "keras.Input" in message


def test_an_option_tf_keras_lacks_is_refused_not_dropped():
    inputs = keras3.Input((5,))
    dense = L3.Dense(3, name="adapted")
    model3 = keras3.Model(inputs, dense(inputs))
    dense.enable_lora(2)  # LoRA: tf_keras has no such Dense
    with pytest.raises(errors.UnsupportedLayerError,
                       match=r"adapted \(Dense: option lora_rank=2 has no tf_keras equivalent"):
        bridge.to_tf_keras(model3)


def test_outputs_that_differ_are_refused(monkeypatch):
    model3 = with_batchnorm_statistics(residual_cnn())
    monkeypatch.setattr(bridge, "_copy_weights", lambda source, target: None)  # fresh weights
    with pytest.raises(errors.ModelError, match="refuses a different model"):
        bridge.to_tf_keras(model3)


def ill_conditioned_model():
    """Two BatchNorm channels 3e-7 apart, subtracted and scaled by 1e4: the last float32 bit
    of either Kerases' BatchNorm kernel moves the output by a third (Keras 3 EfficientNetB0
    on random inputs does so over 80 layers: 0.25 of its largest logit, 0 in float64)."""
    inputs = keras3.Input((4, 4, 2))
    norm = L3.BatchNormalization(name="norm")
    cancel = L3.Conv2D(1, 1, use_bias=False, name="cancel")
    model = keras3.Model(inputs, cancel(norm(inputs)))
    norm.set_weights([np.float32([1.0, 1.0 + 3e-7]), np.float32([0.0, 0.0]),
                      np.float32([0.1, 0.1]), np.float32([0.3, 0.3])])
    cancel.set_weights([np.float32([1e4, -1e4]).reshape(1, 1, 2, 1)])
    sample = np.repeat(np.random.default_rng(0).standard_normal((8, 4, 4, 1)), 2, axis=-1)
    return model, sample.astype(np.float32)


def test_float32_rounding_an_ill_conditioned_model_amplifies_is_no_refusal():
    model3, sample = ill_conditioned_model()
    model2 = bridge.to_tf_keras(model3, sample=sample)
    apart = bridge.max_difference(model3, model2, sample)
    largest = float(np.max(np.abs(model3(sample))))
    assert apart > 0.1 * largest  # in float32; the same model computing in float64 agrees
    assert flavour_of(model2) == "tf_keras"
    assert_same_weights(model3, model2)


def test_a_translation_that_computes_another_layer_is_refused_naming_it(monkeypatch):
    model3, sample = ill_conditioned_model()
    wrong = dataclasses.replace(translate.TO_TF_KERAS, values={
        ("BatchNormalization", "epsilon"): lambda epsilon: 10 * epsilon})
    monkeypatch.setattr(translate, "TO_TF_KERAS", wrong)
    with pytest.raises(errors.ModelError) as info:
        bridge.to_tf_keras(model3, sample=sample)
    message = str(info.value)
    assert "\n" not in message and "refuses a different model" in message
    assert "in float64 too, first from layer 'norm' (BatchNormalization)" in message


def test_in_float64_rewrites_both_kerases_dtypes_and_refuses_reduced_precision():
    policy = {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}}
    config = {"layers": [{"config": {"dtype": policy, "units": 2}},
                         {"config": {"dtype": "float32", "inner": {"dtype": "int32"}}}]}
    rewritten = translate.in_float64(config)
    assert rewritten["layers"][0]["config"]["dtype"]["config"] == {"name": "float64"}
    assert rewritten["layers"][1]["config"] == {"dtype": "float64", "inner": {"dtype": "int32"}}
    assert policy["config"]["name"] == "float32"  # the model's own config is left as it was
    mixed = {"class_name": "Policy", "config": {"name": "mixed_bfloat16"}}
    with pytest.raises(translate.Untranslatable, match="mixed_bfloat16"):
        translate.in_float64({"layers": [{"config": {"dtype": mixed}}]})


def test_wrong_direction_and_stripped_first():
    model2 = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="k2")
    with pytest.raises(errors.ModelError, match="already a tf_keras model"):
        bridge.to_tf_keras(model2)
    assert bridge.as_tf_keras(model2) is model2
    pruned, _ = prune.prune_to_sparsity(
        keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, name="big")]), 0.5, 1, 10)
    with pytest.raises(errors.UnsupportedLayerError, match="call tfaccel.strip_pruning first"):
        bridge.to_keras3(pruned)
    with pytest.raises(errors.ConfigError, match="flavour='keras2'"):
        prune.strip_pruning(pruned, flavour="keras2")
    assert flavour_of(prune.strip_pruning(pruned, flavour="keras3")) == "keras3"


# ---------------------------------------------------------------- TF-MOT on Keras 3 models


@pytest.fixture(scope="module")
def trained3(digits):
    """The residual CNN trained in Keras 3 on digits, and its test accuracy."""
    _, (x, y), (x_test, y_test) = digits
    keras3.utils.set_random_seed(0)
    model3 = residual_cnn()
    model3.compile(keras3.optimizers.Adam(2e-3), "sparse_categorical_crossentropy",
                   metrics=["accuracy"])
    model3.fit(x, y, batch_size=64, epochs=30, verbose=0)
    return model3, accuracy3(model3, x_test, y_test)


def accuracy3(model3, x, y):
    return float(np.mean(model3.predict(x, verbose=0).argmax(-1) == y))


@pytest.mark.slow
def test_pruning_a_keras3_model_returns_a_sparse_keras3_model(digits, trained3):
    splits, _, (x_test, y_test) = digits
    model3, dense_accuracy = trained3
    epochs, steps = 4, 20
    plan = prune.plan_pruning(model3)
    pruned, callbacks = prune.prune_to_sparsity(model3, 0.8, epochs, steps)
    assert flavour_of(pruned) == "tf_keras"
    training.compile_classifier(pruned, training.make_optimizer("adam", 5e-4))
    pruned.fit(tfaccel.batch_dataset(splits.train, 64, training=True).repeat(), epochs=epochs,
               steps_per_epoch=steps, callbacks=callbacks, verbose=0)
    small3 = prune.strip_pruning(pruned)
    assert flavour_of(small3) == "keras3"
    assert set(plan.pruned) >= {"conv_1", "dense"}
    for name in plan.pruned:
        kernel = small3.get_layer(name).kernel.numpy()
        assert abs(np.mean(kernel == 0) - 0.8) < 0.01, name
    report = sparsity.sparsity_report(small3, plan.pruned)
    assert abs(report["pruned"]["sparsity"] - 0.8) < 0.01
    pruned_accuracy = accuracy3(small3, x_test, y_test)
    print(f"keras3 digits accuracy: dense {dense_accuracy:.4f}, pruned 80% {pruned_accuracy:.4f}, "
          f"pruned sparsity {report['pruned']['sparsity']:.4f}")
    assert pruned_accuracy >= dense_accuracy - 0.01


@pytest.mark.slow
def test_qat_of_a_keras3_model_gives_an_int8_tflite_as_accurate_as_float(digits, trained3,
                                                                         tmp_path):
    splits, _, (x_test, y_test) = digits
    model3, float_accuracy = trained3
    qat = quantize.quantize_aware(model3)
    training.compile_classifier(qat, training.make_optimizer("adam", 5e-4))
    # A fresh QAT model needs its quantizer ranges trained: 2 epochs gave 0.956 here, 3 0.989.
    qat.fit(tfaccel.batch_dataset(splits.train, 64, training=True), epochs=4, verbose=0)
    path = tflite.convert_to_tflite(qat, str(tmp_path / "qat_int8.tflite"), mode="int8")
    result = tflite_eval.evaluate_tflite(path, (x_test, y_test), progress=False)
    float_tflite = tflite.convert_to_tflite(model3, str(tmp_path / "float.tflite"))  # bridged
    float_file = tflite_eval.evaluate_tflite(float_tflite, (x_test, y_test), progress=False)
    print(f"keras3 digits accuracy: float {float_accuracy:.4f}, float TFLite "
          f"{float_file['accuracy']:.4f}, QAT int8 TFLite {result['accuracy']:.4f}")
    assert float_file["accuracy"] == pytest.approx(float_accuracy, abs=1e-6)
    assert result["accuracy"] >= float_accuracy - 0.01


# ---------------------------------------------------------------- TF_USE_LEGACY_KERAS contained

_ONE_PROCESS = """
import json, os, sys
import keras
import numpy as np
import tensorflow as tf
before = {"keras": keras.__version__, "env": os.environ.get("TF_USE_LEGACY_KERAS")}
if READ_TF_KERAS_FIRST:
    before["tf.keras"] = [tf.keras.__name__, tf.keras.version()]
import tfaccel
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, name="big"),
                          keras.layers.Dense(10, name="head")])
pruned, callbacks = tfaccel.prune_to_sparsity(model, 0.5, 1, 2)
tfaccel.compile_classifier(pruned, tfaccel.make_optimizer("adam", 1e-3))
pruned.fit(np.zeros((8, 64), np.float32), np.zeros(8), batch_size=4, callbacks=callbacks,
           verbose=0)
small = tfaccel.strip_pruning(pruned)
import keras as keras_again
after = {"keras": keras_again.__version__, "env": os.environ.get("TF_USE_LEGACY_KERAS"),
         "tf.keras": [tf.keras.__name__, tf.keras.version()],
         "small": type(small).__module__, "tfmot": "tensorflow_model_optimization" in sys.modules}
print(json.dumps({"before": before, "after": after}))
"""


@pytest.mark.parametrize("read_first", [pytest.param(True, marks=pytest.mark.slow), False],
                         ids=["tf_keras_read_before", "not_read"])
def test_tfmot_leaves_keras_tf_keras_and_the_environment_as_they_were(read_first):
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    code = _ONE_PROCESS.replace("READ_TF_KERAS_FIRST", str(read_first))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    before, after = seen["before"], seen["after"]
    assert after["tfmot"] and after["small"].startswith("keras.")  # pruned, back as Keras 3
    assert after["keras"] == before["keras"] and after["keras"].startswith("3.")
    assert after["env"] is None and before["env"] is None
    # tf.keras is what it was, or (not read before) what the user's environment makes it.
    assert after["tf.keras"] == before.get("tf.keras", after["tf.keras"])
    assert after["tf.keras"][1].startswith("3.")


def _large_output_model():
    """A Keras 3 model of standard layers whose outputs are about 1,000."""
    inputs = keras3.Input((4,))
    dense = keras3.layers.Dense(3, kernel_initializer=keras3.initializers.Constant(500.0))
    return keras3.Model(inputs, dense(inputs))


def test_the_check_allows_rounding_that_grows_with_the_outputs(monkeypatch):
    # A translation 2e-3 away from outputs of ~1,000 (a deep random-init ResNet50's logits and
    # their measured float32 rounding): accepted by atol + rtol x the largest |output|, refused
    # by the absolute check alone, and the refusal names what works on the model as it is.
    model = _large_output_model()
    sample = np.ones((2, 4), np.float32)
    monkeypatch.setattr(bridge, "max_difference", lambda a, b, sample=None: 2e-3)
    assert flavour_of(bridge.to_tf_keras(model, sample=sample)) == "tf_keras"
    with pytest.raises(errors.ModelError) as info:
        bridge.to_tf_keras(model, sample=sample, rtol=0)
    message = str(info.value)
    assert "\n" not in message and "up to 0.002 away from the original (atol=1e-05, rtol=0)" \
        in message
    assert "tfaccel's limit" in message and "method='native'" in message
    assert "keras3_quantized(model, 'int8')" in message


def test_auto_pruning_of_a_model_whose_translation_is_refused_prunes_natively(monkeypatch):
    model = _large_output_model()

    def refuse(model, *args, **kwargs):
        raise errors.ModelError("the tf_keras translation of 'x' gives outputs up to 1 away")

    monkeypatch.setattr(prune, "as_tf_keras", refuse)
    pruned, _ = prune.prune_to_sparsity(model, 0.5, 1, 2, prune.PruneConfig(min_weights=0))
    assert flavour_of(pruned) == "keras3" and prune.choose_method(model) == "tfmot"
    with pytest.raises(errors.ModelError):  # TF-MOT asked for by name: the refusal stands
        prune.prune_to_sparsity(model, 0.5, 1, 2, prune.PruneConfig(min_weights=0),
                                method="tfmot")
