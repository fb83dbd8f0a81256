"""Gradient accumulation: N micro-batches of B give the update of one batch of N*B."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import FLAVOURS, keras_of_flavour, mirrored_strategy

from tfaccel.errors import ConfigError, ModelError
from tfaccel.keras import keras
from tfaccel.performance import accumulate
from tfaccel.train import precision

BATCH, STEPS = 32, 4  # 4 micro-batches of 8


def _data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 8, 8, 1)).astype("float32"), rng.integers(0, 10, n)


def _model(keras=keras):
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(16, activation="relu")(x)
    x = keras.layers.Dense(10)(x)
    return keras.Model(inputs, keras.layers.Activation("softmax", dtype="float32")(x))


def _train(strategy, policy, accum_steps, x, y, flavour="tf_keras"):
    """Two SGD steps (batch 32) with a schedule that changes after the first step."""
    keras = keras_of_flavour(flavour)
    with precision.precision_scope(policy), strategy.scope():
        keras.utils.set_random_seed(1)
        model = _model(keras)
        initial = [w.copy() for w in model.get_weights()]
        schedule = keras.optimizers.schedules.PiecewiseConstantDecay([1], [0.5, 0.25])
        optimizer = precision.wrap_optimizer(keras.optimizers.SGD(schedule), policy)
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy())
        accumulate.enable_gradient_accumulation(model, accum_steps)
        history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), epochs=1,
                            verbose=0)
    return model, initial, history.history["loss"][0]


STRATEGIES = {"default": lambda: tf.distribute.get_strategy(),
              "mirrored": mirrored_strategy}


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("strategy_name,policy", [
    ("default", "float32"),
    ("default", "mixed_float16"),
    pytest.param("mirrored", "float32", marks=pytest.mark.slow),
    pytest.param("mirrored", "mixed_float16", marks=pytest.mark.slow),
])
def test_micro_batches_give_the_big_batch_update(strategy_name, policy, flavour):
    _check_equivalence(strategy_name, policy, flavour)


def _loss_scale(optimizer):
    scale = getattr(optimizer, "loss_scale", None)  # tf_keras; Keras 3: dynamic_scale
    return float(np.asarray(scale if scale is not None else optimizer.dynamic_scale.numpy()))


def _check_equivalence(strategy_name, policy, flavour="tf_keras"):
    x, y = _data()
    reference, initial, ref_loss = _train(tf.distribute.get_strategy(), policy, 1, x, y, flavour)
    model, initial_acc, loss = _train(STRATEGIES[strategy_name](), policy, STEPS, x, y, flavour)
    # Same start, and two real optimizer steps (the schedule counted steps, not micro-batches).
    assert all(np.array_equal(a, b) for a, b in zip(initial, initial_acc))
    assert int(model.optimizer.iterations.numpy()) == 2
    updates = [w - w0 for w, w0 in zip(model.get_weights(), initial)]
    ref_updates = [w - w0 for w, w0 in zip(reference.get_weights(), initial)]
    scale = max(np.abs(u).max() for u in ref_updates)
    assert scale > 1e-3  # the weights really moved
    worst = max(np.abs(u - r).max() for u, r in zip(updates, ref_updates))
    if policy == "float32":
        assert worst < 1e-5 * max(1.0, scale), worst
        assert loss == pytest.approx(ref_loss, rel=1e-5)
    else:
        # float16 rounds each micro-batch's activations differently; a wrong loss
        # scale or a missing unscale would be off by orders of magnitude.
        assert worst < 0.02 * scale, (worst, scale)
        assert _loss_scale(model.optimizer) == 2.0 ** 15
        assert _loss_scale(reference.optimizer) == 2.0 ** 15
        assert loss == pytest.approx(ref_loss, rel=2e-2)


# The recipes refuse --grad_accum_steps=0 with this same check as their flags are parsed
# (tests/test_bad_inputs.py: grad_accum_zero, lm_grad_accum_zero).
@pytest.mark.parametrize("steps", [0, -2, 1.5, True])
def test_bad_step_counts_are_rejected(steps):
    with pytest.raises(ConfigError, match="grad_accum_steps"):
        accumulate.check_accumulation_steps(steps)


def test_batch_must_split_over_replicas_and_micro_batches():
    assert accumulate.check_accumulation_steps(4, batch_size=64, num_replicas=2) == 8
    with pytest.raises(ConfigError, match="batch_size=60 .* multiple of 8"):
        accumulate.check_accumulation_steps(4, batch_size=60, num_replicas=2)


def test_unbuilt_model_is_rejected():
    model = keras.Sequential([keras.layers.Dense(2)])
    with pytest.raises(ModelError, match="not built"):
        accumulate.enable_gradient_accumulation(model, 2)


def test_partial_last_batch_trains():
    x, y = _data(40)  # batches of 32 and 8; 8 splits into 4 micro-batches of 2
    model = _model()
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy())
    accumulate.enable_gradient_accumulation(model, 4)
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert int(model.optimizer.iterations.numpy()) == 2


def test_keras3_optimizer_accumulation_gives_the_same_update_as_micro_batches():
    # Keras 3's own gradient_accumulation_steps (one replica): 4 fit steps of 8 are one update,
    # the same as tfaccel's 4 micro-batches of a batch of 32.
    from tfaccel.train import training

    x, y = _data()
    model, initial, _ = _train(tf.distribute.get_strategy(), "float32", STEPS, x, y, "keras3")
    keras3 = keras_of_flavour("keras3")
    keras3.utils.set_random_seed(1)
    native = _model(keras3)
    assert all(np.array_equal(a, b) for a, b in zip(initial, native.get_weights()))
    # A tf_keras schedule, counted in updates (Keras 3 alone would count batches).
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([1], [0.5, 0.25])
    training.compile_classifier(native, training.make_optimizer(
        "sgd", schedule, flavour="keras3", accumulation_steps=STEPS))
    native.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH // STEPS), epochs=1,
               verbose=0)
    assert int(native.optimizer.iterations.numpy()) == 2  # updates, not fit steps
    for a, b in zip(native.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="Keras 3's optimizer argument"):
        training.make_optimizer("sgd", 0.1, accumulation_steps=4)  # tf_keras: not this way
