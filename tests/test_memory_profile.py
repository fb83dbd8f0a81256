"""tfaccel.performance.memory_profile: parameters and kept activations, without running a model."""

import pytest

from tfaccel.choices import MODELS
from tfaccel.errors import ConfigError, ModelError
from tfaccel.keras import keras
from tfaccel.performance import memory_profile
from tfaccel.train import models


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_parameters_equal_count_params_for_every_zoo_model(name, precision):
    shape = (96, 96, 3) if name in ("resnet", "mobilenet_v2") else (8, 8, 1)
    profile = memory_profile.profile_zoo_model(name, shape, 10, precision)
    model = models.build_model(name, shape, 10)
    assert profile.parameters == model.count_params()
    assert sum(layer.parameters for layer in profile.layers) == model.count_params()
    assert profile.half_activations == (precision != "float32")


def test_mixed_precision_halves_the_activations():
    full = memory_profile.profile_zoo_model("resnet", (32, 32, 3), 10, "float32")
    half = memory_profile.profile_zoo_model("resnet", (32, 32, 3), 10, "mixed_bfloat16")
    ratio = half.activation_bytes() / full.activation_bytes()
    assert 0.5 <= ratio < 0.56  # the float32 head and the input cast stay as they are


def test_what_a_layer_keeps():
    inputs = keras.Input((4, 4, 2))
    a = keras.layers.Conv2D(3, 3, padding="same", activation="relu", name="conv")(inputs)
    b = keras.layers.Flatten(name="flat")(a)
    c = keras.layers.Dropout(0.5, name="drop")(b)
    d = keras.layers.Dense(5, name="dense")(c)
    model = keras.Model(inputs, keras.layers.Softmax(name="softmax")(d))
    kept = {layer.name: layer.activation_bytes
            for layer in memory_profile.profile_keras_model(model).layers}
    out = 4 * 4 * 3 * 4
    assert kept["conv"] == 2 * out  # its output (ReLU's gradient) and its pre-activation
    assert kept["flat"] == 0  # a view
    assert kept["drop"] == 2 * out  # output (Dense reads it) and mask
    assert kept["dense"] == 0  # only Softmax reads it, and Softmax's gradient needs its output
    assert kept["softmax"] == 5 * 4


def test_sequential_models_are_chains():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="a"),
                              keras.layers.Dense(3, name="b")])
    layers = {layer.name: layer for layer in memory_profile.profile_keras_model(model).layers}
    assert layers["a"].activation_bytes == 4 * 4  # b reads it
    assert layers["b"].activation_bytes == 0  # the loss's input: nothing after it reads it


def test_a_shared_layer_keeps_its_activations_once_per_call():
    shared = keras.layers.Dense(4, activation="relu", name="shared")
    a, b = keras.Input((6,)), keras.Input((6,))
    model = keras.Model([a, b], keras.layers.Add(name="add")([shared(a), shared(b)]))
    layers = {layer.name: layer for layer in memory_profile.profile_keras_model(model).layers}
    assert layers["shared"].activation_bytes == 2 * 4 * 4  # ReLU's output, for each call
    assert layers["shared"].parameters == 6 * 4 + 4  # its weights once


def test_subclassed_and_unsized_models_are_refused():
    class Net(keras.Model):
        def call(self, x):
            return x

    net = Net()
    net(keras.Input((3,)))
    with pytest.raises(ModelError, match="subclassed"):
        memory_profile.profile_keras_model(net)
    inputs = keras.Input((None, 3))
    unsized = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    with pytest.raises(ModelError, match="unknown dimension"):
        memory_profile.profile_keras_model(unsized)


def test_transformer_parameters_match_known_models():
    gpt2 = memory_profile.profile_transformer(12, 768, 12, 50257, 1024)
    assert gpt2.parameters == 124_439_808  # GPT-2 small, tied embeddings
    layers, heads, d_model, context = memory_profile.GPT_SIZES["tiny"]
    tiny = memory_profile.profile_transformer(layers, d_model, heads, 103, context)
    assert 0.75e6 < tiny.parameters < 0.85e6  # "about 0.8M" (issue #15)
    per_block, total = memory_profile.transformer_parameters(40, 5120, 32000, 2048)
    assert per_block == 12 * 5120**2 + 13 * 5120
    assert total == 40 * per_block + (32000 + 2048) * 5120 + 2 * 5120


def test_transformer_activations_follow_korthikanti():
    s, h, a, layers = 2048, 5120, 40, 40
    profile = memory_profile.profile_transformer(layers, h, a, 32000, s)
    block = profile.layers[1].activation_bytes
    assert block == s * (34 * h + 5 * a * s) + s * (2 * h + a * s)
    assert profile.activation_bytes(recompute=True) < profile.activation_bytes() / 20
    full = memory_profile.profile_transformer(layers, h, a, 32000, s, half=False)
    assert full.layers[1].activation_bytes == 2 * block


@pytest.mark.parametrize("kwargs,message", [
    ({"layers": 0}, "layers=0"), ({"heads": 3}, "not divisible by heads=3")])
def test_bad_transformer_sizes(kwargs, message):
    size = {"layers": 2, "d_model": 64, "heads": 2, "vocab_size": 50, "sequence_length": 16}
    with pytest.raises(ConfigError, match=message):
        memory_profile.profile_transformer(**{**size, **kwargs})
