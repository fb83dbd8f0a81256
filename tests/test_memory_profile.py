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


def _kept_bytes_per_example(model, batch, length, prefix):
    """Bytes per example of the forward tensors named `prefix`* that the backward ops of a
    training step of `model` read (weight casts left out: the plan counts them apart)."""
    import numpy as np
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = loss_fn(x, model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    graph = step.get_concrete_function(tf.TensorSpec((batch, length), tf.int32)).graph
    kept = {}
    for op in graph.get_operations():
        if not op.name.startswith("gradient_tape/"):
            continue
        for t in op.inputs:
            while t.op.type in ("Identity", "Reshape"):  # views share their input's buffer
                t = t.op.inputs[0]
            source = t.op
            if (source.name.startswith(prefix)
                    and source.type not in ("Const", "Shape", "ReadVariableOp")
                    and not (source.type == "Cast" and source.inputs[0].op.type ==
                             "ReadVariableOp")):
                assert t.shape.is_fully_defined(), f"{t.name}: shape {t.shape} not static"
                kept[t.name] = int(np.prod(t.shape.as_list())) * t.dtype.size
    return sum(kept.values()) / batch


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_transformer_block_keeps_what_the_gradient_graph_reads(policy, dropout):
    from tfaccel.train import gpt, precision

    layers, h, a, s = 2, 64, 4, 32
    with precision.precision_scope(policy):
        model = gpt.build_gpt(gpt.GPTConfig(vocab_size=50, context=s, layers=layers, heads=a,
                                            d_model=h, dropout=dropout))
        kept = _kept_bytes_per_example(model, 2, s, "gpt/block_1_")
    profile = memory_profile.profile_transformer(layers, h, a, 50, s, tied=False,
                                                 half=policy != "float32", dropout=dropout)
    assert profile.parameters == model.count_params()
    # recomputed, a block keeps its input: the residual stream, float32 under either policy
    stream = model.get_layer("block_0_mlp_add").output
    assert profile.layers[2].recompute_boundary_bytes == s * h * stream.dtype.size == 4 * s * h
    shorter = memory_profile.profile_transformer(layers, h, a, 50, s // 2, tied=False,
                                                 context=s)  # a run on shorter windows
    assert shorter.parameters == model.count_params()
    # the LayerNorms' per-token mean and variance (12 s bytes each) are not counted
    assert kept == pytest.approx(profile.layers[2].activation_bytes, rel=0.01)
    with precision.precision_scope(policy):
        head = sum(_kept_bytes_per_example(model, 2, s, prefix) for prefix in
                   ("gpt/final_ln", "gpt/logits", "sparse_categorical_crossentropy"))
    assert head == pytest.approx(profile.layers[-1].activation_bytes, rel=0.02)


def test_transformer_activations_at_13b():
    s, h, a, layers = 2048, 5120, 40, 40
    profile = memory_profile.profile_transformer(layers, h, a, 32000, s)
    block = profile.layers[1].activation_bytes
    assert block == s * (60 * h + 2 * a * s)
    assert profile.layers[1].recompute_boundary_bytes == 4 * s * h  # a float32 stream
    assert profile.activation_bytes(recompute=True) < profile.activation_bytes() / 12
    full = memory_profile.profile_transformer(layers, h, a, 32000, s, half=False)
    assert full.layers[1].activation_bytes == 4 * s * (26 * h + a * s)


@pytest.mark.parametrize("kwargs,message", [
    ({"layers": 0}, "layers=0"), ({"heads": 3}, "not divisible by heads=3")])
def test_bad_transformer_sizes(kwargs, message):
    size = {"layers": 2, "d_model": 64, "heads": 2, "vocab_size": 50, "sequence_length": 16}
    with pytest.raises(ConfigError, match=message):
        memory_profile.profile_transformer(**{**size, **kwargs})
