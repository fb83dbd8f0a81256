"""Mixed precision: policies, float32 outputs and copies, loss scaling, hardware advice.

Timing the settings against each other (auto selection) is tested in test_trials.py."""

import hub_models
import numpy as np
import pytest
import tensorflow as tf
from conftest import keras_of_flavour

from tfaccel import data
from tfaccel.errors import ConfigError, ModelError
from tfaccel.keras import keras
from tfaccel.train import models, precision, training


@pytest.fixture(scope="module")
def digits():
    return data.load_dataset("digits")


def _train_digits(splits, model_name, policy, epochs):
    with precision.precision_scope(policy):
        keras.utils.set_random_seed(0)
        # A narrower CNN than the zoo default: float16 is emulated on CPUs (the zoo CNN took
        # 190 s for these 5 epochs on an AMX Xeon), and the convolutions under loss scaling are
        # what this checks, not their width.
        size = {"filters": (8, 16), "dense_units": 64} if model_name == "cnn" else {}
        model = models.build_model(model_name, splits.info.input_shape, splits.info.num_classes,
                                   **size)
        model = precision.apply_precision(model, policy)
        optimizer = precision.wrap_optimizer(training.make_optimizer("adam", 3e-3), policy)
        training.compile_classifier(model, optimizer)
        model.fit(data.batch_dataset(splits.train, 64, training=True), epochs=epochs, verbose=0)
        test = training.evaluate(model, data.batch_dataset(splits.test, 256, training=False))
        probabilities = model(np.zeros((2, *splits.info.input_shape), np.float32))
    return model, test, probabilities


@pytest.mark.parametrize("model_name,policy,epochs", [
    ("mlp", "float32", 6),
    # Emulated on this CPU, hence slow; the CNN adds convolutions under loss scaling.
    pytest.param("mlp", "mixed_float16", 6, marks=pytest.mark.slow),
    pytest.param("mlp", "mixed_bfloat16", 6, marks=pytest.mark.slow),
    pytest.param("cnn", "mixed_float16", 5, marks=pytest.mark.slow),
])
def test_trains_digits_under_each_precision(digits, model_name, policy, epochs):
    model, test, probabilities = _train_digits(digits, model_name, policy, epochs)
    assert test["accuracy"] >= 0.95, test
    assert probabilities.dtype == tf.float32 and model.outputs[0].dtype == tf.float32
    assert np.allclose(probabilities.numpy().sum(axis=1), 1.0, atol=1e-5)
    hidden = {row["layer"]: row for row in precision.layer_dtypes(model)}
    expected = {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
    first = "dense_0" if model_name == "mlp" else "conv_0"
    assert hidden[first]["compute_dtype"] == expected[policy]
    assert hidden[first]["variable_dtype"] == "float32"
    assert hidden["probabilities"]["compute_dtype"] == "float32"
    is_scaled = isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert is_scaled == (policy == "mixed_float16")
    assert keras.mixed_precision.global_policy().name == "float32"  # restored


def test_unknown_precision_is_rejected():
    with pytest.raises(ConfigError, match="unknown precision 'fp8'.*float32, mixed_float16"):
        precision.check_precision("fp8")
    with pytest.raises(ConfigError):
        precision.check_precision("auto")
    assert precision.check_precision("auto", allow_auto=True) == "auto"
    with pytest.raises(ConfigError, match="jit_compile='maybe'"):
        precision.parse_jit_compile("maybe")
    assert [precision.parse_jit_compile(v) for v in ("TRUE", "false", "auto", True)] == [
        True, False, "auto", True]


def test_scope_restores_policy_after_an_error():
    with pytest.raises(RuntimeError), precision.precision_scope("mixed_bfloat16"):
        assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
        raise RuntimeError("boom")
    assert keras.mixed_precision.global_policy().name == "float32"


def _float32_dense_softmax_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")])


def test_loaded_float32_model_is_rebuilt_with_float32_outputs(tmp_path):
    path = str(tmp_path / "m.keras")
    _float32_dense_softmax_model().save(path)
    loaded = keras.models.load_model(path)
    x = np.random.default_rng(0).normal(size=(4, 6)).astype("float32")
    with precision.precision_scope("mixed_float16"):
        converted = precision.apply_precision(loaded, "mixed_float16")
        assert converted is not loaded
        dtypes = [row["compute_dtype"] for row in precision.layer_dtypes(converted)]
        assert dtypes == ["float16", "float32"]  # hidden in float16, the softmax layer in float32
        out = converted(x)
        assert out.dtype == tf.float32
        assert np.allclose(out.numpy(), loaded(x).numpy(), atol=5e-3)  # same weights
        # Built under the policy already: kept as is.
        assert precision.apply_precision(converted, "mixed_float16") is converted
    assert precision.apply_precision(loaded, "float32") is loaded


def test_model_fn_model_without_float32_head_gets_one():
    with precision.precision_scope("mixed_bfloat16"):
        model = _float32_dense_softmax_model()  # built under the policy: ends in bfloat16
        assert model.outputs[0].dtype == tf.bfloat16
        fixed = precision.apply_precision(model, "mixed_bfloat16")
        assert fixed.outputs[0].dtype == tf.float32
        assert fixed.layers[0].compute_dtype == "bfloat16"


def test_subclassed_model_that_does_not_match_is_rejected():
    class Tiny(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(4)
            self.head = keras.layers.Dense(2, dtype="float32")

        def call(self, x):
            return self.head(self.hidden(x))

    model = Tiny()
    model(np.zeros((1, 3), np.float32))
    with pytest.raises(ModelError, match="subclassed model"):
        precision.apply_precision(model, "mixed_float16")  # hidden layer built in float32
    assert precision.apply_precision(model, "float32") is model
    with precision.precision_scope("mixed_float16"):
        built_under_policy = Tiny()
    assert precision.apply_precision(built_under_policy, "mixed_float16") is built_under_policy
    with pytest.raises(ModelError, match="cannot be rebuilt from its config"):
        precision.apply_precision(model, "float32", copy=True)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_model_to_float32_copy_has_the_same_weights(policy):
    # What quantization, pruning export and size reports use: one float32 copy.
    with precision.precision_scope(policy):
        keras.utils.set_random_seed(0)
        mixed = models.build_model("cnn", (8, 8, 1), 10, filters=(4,), dense_units=8)
    assert mixed.get_layer("conv_0").dtype_policy.name == policy
    copy = precision.apply_precision(mixed, "float32")
    assert copy is not mixed and keras.mixed_precision.global_policy().name == "float32"
    assert {layer.dtype_policy.name for layer in copy.layers} == {"float32"}
    assert {row["compute_dtype"] for row in precision.layer_dtypes(copy)} == {"float32"}
    assert all(w.dtype == np.float32 for w in copy.get_weights())
    for a, b in zip(mixed.get_weights(), copy.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 1)).astype("float32")
    out = copy(x)
    assert out.dtype == tf.float32
    np.testing.assert_allclose(out.numpy(), mixed(x).numpy(), atol=2e-2)  # half vs full
    assert mixed.get_layer("conv_0").dtype_policy.name == policy  # the original is untouched


def test_copy_gives_a_new_model_even_when_nothing_changes():
    model = _float32_dense_softmax_model()
    assert precision.apply_precision(model, "float32") is model
    copy = precision.apply_precision(model, "float32", copy=True)
    assert copy is not model and copy.layers[1] is not model.layers[1]
    for a, b in zip(model.get_weights(), copy.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    copy.layers[1].kernel.assign(tf.zeros_like(copy.layers[1].kernel))
    assert np.any(model.layers[1].kernel.numpy() != 0)  # separate variables


def test_wrap_optimizer_only_for_float16(flavour):
    keras = keras_of_flavour(flavour)
    sgd = keras.optimizers.SGD(0.1)
    wrapped = precision.wrap_optimizer(sgd, "mixed_float16")
    assert isinstance(wrapped, keras.mixed_precision.LossScaleOptimizer)
    assert getattr(wrapped, "dynamic", True)  # Keras 3's is always dynamic
    assert precision.wrap_optimizer(wrapped, "mixed_float16") is wrapped
    assert precision.wrap_optimizer(sgd, "mixed_bfloat16") is sgd
    assert precision.wrap_optimizer(sgd, "float32") is sgd


def test_scaled_gradients_in_a_custom_loop_make_the_plain_update(flavour):
    keras = keras_of_flavour(flavour)
    v = keras.Variable([1.0, -2.0]) if flavour == "keras3" else tf.Variable([1.0, -2.0])
    optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.1), "mixed_float16")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * v) * 1e-6  # small: its float16 gradient would underflow unscaled
    grads = precision.scaled_gradients(tape, loss, [v], optimizer)
    optimizer.apply_gradients(zip(grads, [v]))  # Keras 3 unscales here, tf_keras before
    np.testing.assert_allclose(np.asarray(v.numpy()), [1.0 - 2e-7, -2.0 + 4e-7], rtol=1e-7)


def test_hardware_advice():
    k80 = [{"name": "Tesla K80", "compute_capability": (3, 7)}]
    v100 = [{"name": "Tesla V100", "compute_capability": (7, 0)}]
    a100 = [{"name": "A100", "compute_capability": (8, 0)}]
    assert "needs >= 7.0" in precision.precision_advice("mixed_float16", gpus=k80)[0]
    assert precision.precision_advice("mixed_float16", gpus=v100) == []
    assert "needs >= 8.0" in precision.precision_advice("mixed_bfloat16", gpus=v100)[0]
    assert precision.precision_advice("mixed_bfloat16", gpus=a100) == []
    assert "no GPU" in precision.precision_advice("mixed_float16", gpus=[])[0]
    assert "no bfloat16 instructions" in precision.precision_advice(
        "mixed_bfloat16", gpus=[], cpu_flags={"avx2"})[0]
    assert precision.precision_advice("mixed_bfloat16", gpus=[], cpu_flags={"amx_bf16"}) == []
    assert precision.precision_advice("mixed_bfloat16", gpus=[],
                                      cpu_flags={"avx512_bf16"}) == []
    # float16 math on the CPU (AVX512_FP16, AMX-FP16) is named, and still advised against.
    fp16 = precision.precision_advice("mixed_float16", gpus=[],
                                      cpu_flags={"avx512_fp16", "amx_fp16", "amx_bf16"})
    assert len(fp16) == 1 and "this CPU's AMX-FP16/AVX512_FP16 float16 math is not used" in fp16[0]
    assert "float16 math" not in precision.precision_advice("mixed_float16", gpus=[],
                                                            cpu_flags={"avx2"})[0]
    assert precision.precision_advice("float32", gpus=k80) == []


def _hub_models():
    return hub_models.gpt2_and_bert()


def test_a_kerashub_model_built_under_the_policy_is_left_alone():
    with precision.precision_scope("mixed_bfloat16"):
        for model in _hub_models():
            assert precision.apply_precision(model, "mixed_bfloat16") is model


def test_a_kerashub_model_rebuilt_in_another_precision_keeps_its_class_and_weights():
    with precision.precision_scope("mixed_bfloat16"):
        gpt2, _ = _hub_models()
    tokens = {"token_ids": np.arange(8, dtype=np.int32)[None] % 100,
              "padding_mask": np.ones((1, 8), np.int32)}
    copy = precision.apply_precision(gpt2, "float32")
    assert type(copy) is type(gpt2) and hasattr(copy, "generate")
    assert copy.backbone.dtype_policy.name == "float32"
    assert copy(tokens).dtype == "float32"
    np.testing.assert_allclose(np.asarray(copy(tokens)), np.asarray(gpt2(tokens), np.float32),
                               atol=0.05)  # bfloat16 rounding of the original's logits
    again = precision.apply_precision(copy, "float32", copy=True)
    assert again is not copy and type(again) is type(gpt2)


@pytest.mark.parametrize("gpus, cpu_flags, expected", [
    ([], {"avx2", "fma"}, ("float32",)),  # AVX2-only CPU: nothing beats float32's kernels
    ([], {"avx512f", "avx512_bf16"}, ("float32", "mixed_bfloat16")),
    ([], {"amx_bf16", "amx_tile", "avx512_fp16"}, ("float32", "mixed_bfloat16")),
    ([{"name": "RTX 4090", "compute_capability": (8, 9)}], set(), precision.PRECISIONS),
    ([{"name": "T4", "compute_capability": (7, 5)}], set(), ("float32", "mixed_float16")),
])
def test_auto_candidates_leave_out_the_precisions_the_hardware_cannot_speed_up(gpus, cpu_flags,
                                                                             expected):
    assert precision.auto_candidates(gpus=gpus, cpu_flags=cpu_flags) == expected
