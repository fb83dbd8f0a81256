"""compress.magnitude and compress.prunable: magnitude pruning without TF-MOT, on tf_keras and
Keras 3 models, custom layers and KerasHub included; the same zeros as TF-MOT, its schedules,
2:4, resuming, and one-line refusals."""

import math

import keras as keras3
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored_strategy
from test_pruning_plan import small_cnn

from tfaccel import data, summaries
from tfaccel.compress import magnitude, prunable, prune, sparsity
from tfaccel.compress.pruning_plan import PruneConfig
from tfaccel.errors import ConfigError, UnsupportedLayerError
from tfaccel.keras import flavour_of, keras, tfmot
from tfaccel.train import models, training

L3 = keras3.layers


def one_line(info):
    message = str(info.value)
    assert "\n" not in message, message
    return message


def zeros(variable):
    return int(np.count_nonzero(np.asarray(variable.numpy()) == 0))


# ---------------------------------------------------------------- Keras 3 models with custom layers


class Block(L3.Layer):
    """A user's layer around a Dense: no tf_keras translation exists for it."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.inner = L3.Dense(units, name="inner")

    def build(self, input_shape):
        self.inner.build(input_shape)
        self.scale = self.add_weight(shape=(self.units,), initializer="ones", name="scale")

    def call(self, x):
        return keras3.ops.relu(self.inner(x)) * self.scale

    def get_config(self):
        return {**super().get_config(), "units": self.units}


class OwnKernel(L3.Layer):
    """A layer that multiplies by its own kernel (not a Dense sublayer)."""

    def __init__(self, units, opt_in=True, **kwargs):
        super().__init__(**kwargs)
        self.units, self.opt_in = units, opt_in

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], self.units), name="w")

    def call(self, x):
        return keras3.ops.matmul(x, self.w)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "opt_in": self.opt_in}


class PrunableOwnKernel(OwnKernel):
    def get_prunable_weights(self):  # TF-MOT's PrunableLayer protocol: how a layer opts in
        return [self.w]


def custom_model(own=PrunableOwnKernel):
    inputs = keras3.Input((64,))
    x = Block(64, name="block")(inputs)
    x = own(32, name="own")(x)
    return keras3.Model(inputs, L3.Dense(10, name="head")(x), name="custom")


def random_data(n=128, features=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, features)).astype("float32"), rng.integers(0, 10, n)


def compile3(model, lr=1e-3):
    model.compile(keras3.optimizers.Adam(lr),
                  keras3.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_the_dense_inside_a_custom_layer_is_pruned_to_half():
    model = compile3(custom_model())
    model_class = type(model)
    x, y = random_data()
    same, callbacks = magnitude.prune_magnitude(model, 0.5, end_step=8, frequency=2)
    assert same is model
    plan = callbacks[0].plan
    assert [k.key for k in plan.kernels] == ["block/inner/kernel", "own/w", "head/kernel"]
    model.fit(x, y, batch_size=16, epochs=2, callbacks=callbacks, verbose=0)  # 16 steps
    inner = model.get_layer("block").inner.kernel
    assert zeros(inner) == 64 * 64 // 2  # counted in the weights themselves
    assert zeros(model.get_layer("own").w) == 32 * 64 // 2
    assert zeros(model.get_layer("block").scale) == 0  # 1-D: not a kernel
    report = sparsity.sparsity_report(magnitude.strip_magnitude(model))
    assert {r["layer"]: r["sparsity"] for r in report["layers"]} == {
        "block/inner": 0.5, "own": 0.5, "head": 0.5}
    assert prunable.active_pruning(model) is None
    assert type(model) is model_class and flavour_of(model) == "keras3"


def test_a_layer_that_does_not_opt_in_is_listed_and_its_weights_can_be_passed():
    model = custom_model(own=OwnKernel)
    plan = prunable.plan_kernels(model)
    assert "own/w" not in [k.key for k in plan.kernels]
    assert "OwnKernel holds weights w" in plan.skipped["own"]
    assert "get_prunable_weights()" in plan.skipped["own"]
    with pytest.raises(UnsupportedLayerError) as info:
        prunable.plan_kernels(model, include=("own",))
    assert "layer 'own' (OwnKernel) holds weights w" in one_line(info)
    chosen = prunable.plan_kernels(model, kernels=[model.get_layer("own").w])
    assert [k.key for k in chosen.kernels] == ["own/w"]


def test_prune_to_sparsity_prunes_what_tfmot_cannot_take_natively(tmp_path):
    model = compile3(custom_model())
    assert prune.choose_method(model) == "native"
    assert "block (Block)" in prune.tfmot_refusal(model)
    assert prune.choose_method(small_cnn()) == "tfmot"
    x, y = random_data()
    pruned, callbacks = prune.prune_to_sparsity(model, 0.5, 2, 8, PruneConfig(min_weights=1000),
                                                logdir=str(tmp_path / "logs"))
    assert pruned is model
    model.fit(x, y, batch_size=16, epochs=2, callbacks=callbacks, verbose=0)
    assert callbacks[0].plan.skipped == {"head/kernel": "only 320 weights (< min_weights=1000)"}
    stripped = prune.strip_pruning(model)
    assert stripped is model
    report = sparsity.sparsity_report(stripped)
    assert {r["layer"] for r in report["layers"] if r["pruned"]} == {"block/inner", "own"}
    assert report["pruned"]["sparsity"] == 0.5
    scalars = summaries.read_scalars(tmp_path / "logs")
    assert [value for _, value in scalars["sparsity/block/inner"]][-1] == 0.5
    assert scalars["sparsity/target"][-1][1] == pytest.approx(0.5)
    assert scalars["pruning/step"][-1][1] == 16


def test_a_tf_keras_custom_layer_and_a_subclassed_model_are_pruned_natively():
    class Inner(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = keras.layers.Dense(64, name="inner")

        def call(self, x):
            return self.inner(x)

    class Sub(keras.Model):
        def __init__(self):
            super().__init__(name="sub")
            self.block, self.head = Inner(name="block"), keras.layers.Dense(10, name="head")

        def call(self, x):
            return self.head(self.block(x))

    model = Sub()
    model(tf.zeros((1, 64)))
    assert prune.choose_method(model) == "native"
    x, y = random_data()
    pruned, callbacks = prune.prune_to_sparsity(model, 0.75, 2, 8, PruneConfig(min_weights=0))
    training.compile_classifier(pruned, training.make_optimizer("adam", 1e-3))
    pruned.fit(x, y, batch_size=16, epochs=2, callbacks=callbacks, verbose=0)
    report = sparsity.sparsity_report(prune.strip_pruning(pruned))
    assert {r["layer"]: r["sparsity"] for r in report["layers"]} == {"block/inner": 0.75,
                                                                   "head": 0.75}


def test_the_step_counter_and_masks_survive_a_save_and_load(tmp_path):
    schedule = dict(final_sparsity=0.6, end_step=12, frequency=4)
    x, y = random_data()
    keras3.utils.set_random_seed(0)
    whole = compile3(custom_model())
    first = compile3(keras3.models.clone_model(whole))
    first.set_weights(whole.get_weights())
    _, callbacks = magnitude.prune_magnitude(whole, **schedule)
    whole.fit(x, y, batch_size=16, epochs=2, shuffle=False, callbacks=callbacks, verbose=0)

    _, callbacks = magnitude.prune_magnitude(first, **schedule)
    first.fit(x, y, batch_size=16, epochs=1, shuffle=False, callbacks=callbacks, verbose=0)
    assert callbacks[0].step == 8 and [s for s, _ in callbacks[0].updates] == [4, 8]
    halfway = zeros(first.get_layer("block").inner.kernel)
    path = str(tmp_path / "mid.keras")
    first.save(path)  # optimizer included: its step count is the pruning step
    loaded = keras3.models.load_model(path, custom_objects={"Block": Block,
                                                            "PrunableOwnKernel": PrunableOwnKernel})
    _, callbacks = magnitude.prune_magnitude(loaded, **schedule, start_step=0)
    loaded.fit(x, y, batch_size=16, initial_epoch=1, epochs=2, shuffle=False,
               callbacks=callbacks, verbose=0)
    assert callbacks[0].step == 16 and [s for s, _ in callbacks[0].updates] == [12]
    kernel = loaded.get_layer("block").inner.kernel
    assert halfway < zeros(kernel) == zeros(whole.get_layer("block").inner.kernel)
    assert zeros(kernel) == 64 * 64 - round(64 * 64 * 0.4)


def test_backup_and_restore_resume_the_schedule_where_it_stopped(tmp_path):
    backup = str(tmp_path / "backup")
    epochs, steps = 4, 5
    x, y = random_data(n=80)

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 2 * steps + 2:
                raise RuntimeError("crash")

    def run(extra):
        model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, name="big"),
                                  keras.layers.Dense(10, name="head")], name="seq")
        model, callbacks = prune.prune_to_sparsity(model, 0.75, epochs, steps,
                                                   PruneConfig(min_weights=0), method="native",
                                                   backup_dir=backup)
        training.compile_classifier(model, training.make_optimizer("adam", 1e-3))
        model.fit(x, y, batch_size=16, epochs=epochs, callbacks=[*callbacks, *extra], verbose=0)
        return model, callbacks

    with pytest.raises(RuntimeError, match="crash"):
        run([Crash()])
    model, callbacks = run([])
    assert callbacks[2].resumed_at == (3, 0)  # the epoch-2 backup
    assert min(s for s, _ in callbacks[0].updates) > 2 * steps
    assert callbacks[0].step == epochs * steps
    assert zeros(model.get_layer("big").kernel) == 64 * 64 * 3 // 4


# ---------------------------------------------------------------- the same as TF-MOT


def _pruned_both_ways(model, target, epochs, splits, config=PruneConfig()):
    """{method: (pruned and stripped model, seconds of fit)} from the same copy of `model`,
    trained on the same batches in the same order (a fresh pipeline each: iterating one
    shuffling dataset twice gives another order)."""
    import time

    out = {}
    for method in ("tfmot", "native"):
        keras.utils.set_random_seed(1)
        copy = keras.models.clone_model(model)
        copy.set_weights(model.get_weights())
        steps = data.steps_per_epoch(splits.info.num_examples["train"], 64)
        pruned, callbacks = prune.prune_to_sparsity(copy, target, epochs, steps, config,
                                                    method=method)
        training.compile_classifier(pruned, training.make_optimizer("adam", 1e-3))
        keras.utils.set_random_seed(2)
        train = data.batch_dataset(splits.train, 64, training=True)
        start = time.perf_counter()
        pruned.fit(train, epochs=epochs, callbacks=callbacks, verbose=0)
        out[method] = (prune.strip_pruning(pruned), time.perf_counter() - start)
    return out


def _compare(name, model, target, epochs, splits, x, y):
    both = _pruned_both_ways(model, target, epochs, splits)
    plan = prune.plan_pruning(model)
    reports = {m: sparsity.sparsity_report(small, plan.pruned) for m, (small, _) in both.items()}
    counts = {m: {r["layer"]: r["zeros"] for r in rep["layers"]} for m, rep in reports.items()}
    assert counts["native"] == counts["tfmot"]  # every kernel, to the weight
    for layer in plan.pruned:
        size = next(r["weights"] for r in reports["native"]["layers"] if r["layer"] == layer)
        assert counts["native"][layer] == size - round(np.float32(size) * (1 - np.float32(target)))
    accuracy = {m: float(np.mean(small.predict(x, verbose=0).argmax(-1) == y))
                for m, (small, _) in both.items()}
    same_mask = np.mean([np.mean((a == 0) == (b == 0)) for a, b in zip(
        both["tfmot"][0].get_weights(), both["native"][0].get_weights())])
    print(f"{name} {target:.0%}: accuracy tfmot {accuracy['tfmot']:.4f} native "
          f"{accuracy['native']:.4f}; pruned zeros {reports['native']['pruned']['zeros']} of "
          f"{reports['native']['pruned']['weights']}; same zero positions {same_mask:.4f}; fit "
          f"tfmot {both['tfmot'][1]:.1f}s native {both['native'][1]:.1f}s")
    assert abs(accuracy["native"] - accuracy["tfmot"]) <= 0.005


def test_native_and_tfmot_give_the_same_zeros_on_the_digits_cnn(trained):
    splits, model, x, y, _ = trained  # the zoo CNN trained 4 epochs (conftest)
    _compare("cnn", model, 0.8, 3, splits, x, y)


@pytest.mark.slow
def test_native_and_tfmot_give_the_same_zeros_on_the_zoo_resnet(trained):
    splits, _, x, y, _ = trained
    keras.utils.set_random_seed(0)
    model = models.build_model("resnet", splits.info.input_shape, splits.info.num_classes)
    training.compile_classifier(model, training.make_optimizer("adam", 5e-3))
    model.fit(data.batch_dataset(splits.train, 64, training=True), epochs=8, verbose=0)
    _compare("resnet", model, 0.5, 4, splits, x, y)


# ---------------------------------------------------------------- schedules


SCHEDULES = [("PolynomialDecay", dict(initial_sparsity=0.0, final_sparsity=0.8, begin_step=0,
                                      end_step=100, power=3, frequency=10)),
             ("PolynomialDecay", dict(initial_sparsity=0.1, final_sparsity=0.9, begin_step=5,
                                      end_step=47, power=2, frequency=7)),
             ("ConstantSparsity", dict(target_sparsity=0.6, begin_step=10, end_step=-1,
                                       frequency=5)),
             ("ConstantSparsity", dict(target_sparsity=0.6, begin_step=10, end_step=30,
                                       frequency=4))]


@pytest.mark.parametrize("kind, args", SCHEDULES, ids=lambda v: str(v)[:40])
def test_schedules_give_tfmot_values_at_every_step(kind, args):
    theirs = getattr(tfmot().sparsity.keras, kind)(**args)
    for mine in (getattr(magnitude, kind)(**args), magnitude.schedule_from(theirs)):
        for step in range(0, 140):
            prune_now, value = theirs(tf.constant(step, tf.int64))
            assert mine(step) == (bool(prune_now), np.float32(value.numpy())), step


def test_masks_are_recomputed_every_frequency_steps_to_the_formula():
    model = compile3(keras3.Sequential([keras3.Input((64,)), L3.Dense(50, name="dense"),
                                        L3.Dense(10, name="head")]))
    schedule = magnitude.PolynomialDecay(0.0, 0.75, begin_step=2, end_step=14, frequency=4)
    _, callbacks = magnitude.prune_magnitude(model, schedule=schedule, include=("dense",))
    seen = []

    class Probe(keras3.callbacks.Callback):  # runs after the pruning callback
        def on_train_batch_end(self, batch, logs=None):
            seen.append(zeros(self.model.get_layer("dense").kernel))

    x, y = random_data(n=20 * 8)
    model.fit(x, y, batch_size=8, epochs=1, callbacks=[*callbacks, Probe()], verbose=0)
    updates = [2, 6, 10, 14]
    assert [s for s, _ in callbacks[0].updates] == updates
    size = 64 * 50
    for done, count in enumerate(seen, start=1):  # after step `done`, masked for step done+1
        due = [s for s in updates if s <= done + 1]
        sparsity_now = schedule.sparsity(due[-1]) if due else None
        kept = size if due == [] else max(round(np.float32(size) * (1 - sparsity_now)), 1)
        assert count == size - kept, done
    assert seen[-1] == size * 3 // 4


def tfmot_mask(weights, sparsity):
    """TF-MOT 0.8.1's `Pruning._update_mask`, op for op (pruning_impl.py)."""
    abs_weights = tf.math.abs(weights)
    k = tf.dtypes.cast(tf.math.maximum(tf.math.round(
        tf.dtypes.cast(tf.size(abs_weights), tf.float32) * (1 - sparsity)), 1), tf.int32)
    values, indices = tf.math.top_k(tf.reshape(abs_weights, [-1]), k=tf.size(abs_weights))
    threshold_value, threshold_pos = tf.gather(values, k - 1), tf.gather(indices, k - 1)
    mask = tf.math.logical_or(tf.math.greater_equal(abs_weights, threshold_value), tf.reshape(
        tf.one_hot(threshold_pos, depth=tf.size(abs_weights), on_value=True, off_value=False,
                   dtype=tf.bool), abs_weights.shape))
    return tf.dtypes.cast(mask, weights.dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_mask_is_tfmots_ties_and_tiny_sparsities_included(dtype):
    rng = np.random.default_rng(0)
    kernels = [rng.normal(size=(37, 23)), np.round(rng.normal(size=(64, 8)), 1),  # many ties
               np.zeros((4, 4)), rng.normal(size=(3, 3, 5, 7))]
    for kernel in kernels:
        weights = tf.constant(kernel, dtype)
        for value in (0.0, 0.013, 0.5, 0.8, 0.97, 0.999):
            sparsity_now = np.float32(value)
            np.testing.assert_array_equal(magnitude.magnitude_mask(weights, sparsity_now),
                                          tfmot_mask(weights, tf.constant(sparsity_now)))


# ---------------------------------------------------------------- 2:4


def test_two_four_holds_along_input_axes_and_a_too_small_axis_is_reported(caplog):
    inputs = keras3.Input((8, 8, 1))
    x = L3.Conv2D(8, 3, name="conv_0")(inputs)  # 1 input channel: no group of 4
    x = L3.Conv2D(16, 3, name="conv_1")(x)
    x = L3.Dense(16, name="dense")(L3.Reshape((16, 16))(x))
    x = L3.EinsumDense("abc,cde->abde", (16, 4, 8), name="einsum")(x)
    model = compile3(keras3.Model(inputs, L3.Dense(10, name="head")(L3.Flatten()(x))))
    _, callbacks = magnitude.prune_magnitude(model, m_by_n=(2, 4), end_step=4, frequency=1)
    plan = callbacks[0].plan
    assert plan.unfit == ("conv_0/kernel",)
    assert "divisible by 4, it has 1" in plan.skipped["conv_0/kernel"]
    assert any("conv_0/kernel" in r.getMessage() and r.levelname == "WARNING"
               for r in caplog.records)
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(32, 8, 8, 1)), rng.integers(0, 10, 32), batch_size=8, epochs=2,
              callbacks=callbacks, verbose=0)
    for k in plan.kernels:
        groups, violations = sparsity.m_by_n_violations(k.variable.numpy(), (2, 4), k.axis)
        assert groups == k.size // 4 and violations == 0, k.key
        assert zeros(k.variable) == k.size // 2
    assert [k.axis for k in plan.kernels] == [-2, -2, -3, -2]  # einsum: its contracted axis c
    checks = sparsity.check_m_by_n(model, (2, 4))
    assert set(checks) == {"conv_1", "dense", "einsum", "head"}
    assert all(c["ok"] for c in checks.values())
    with pytest.raises(UnsupportedLayerError) as info:
        prunable.plan_kernels(model, include=("conv_0",), m_by_n=(2, 4))
    message = one_line(info)
    assert "'conv_0/kernel' (3, 3, 1, 8) cannot be pruned as asked" in message
    assert "divisible by 4, it has 1" in message and "m_by_n=None" in message


def test_embeddings_and_depthwise_kernels_have_no_two_four_axis():
    inputs = keras3.Input((6,), dtype="int32")
    x = L3.Embedding(20, 8, name="embed")(inputs)
    x = L3.Reshape((6, 8, 1))(x)
    x = L3.DepthwiseConv2D(3, name="depthwise")(L3.Conv2D(4, 1, name="pointwise")(x))
    x = L3.SeparableConv2D(8, 3, padding="same", name="separable")(x)
    model = keras3.Model(inputs, x)
    found = {k.key: k.axis for k in prunable.find_kernels(model)[0]}
    assert found == {"embed/embeddings": None, "pointwise/kernel": -2, "depthwise/kernel": None,
                     "separable/depthwise_kernel": None, "separable/pointwise_kernel": -2}
    plan = prunable.plan_kernels(model, m_by_n=(2, 4))
    assert [k.key for k in plan.kernels] == ["separable/pointwise_kernel"]
    assert "an embedding table is looked up" in plan.skipped["embed/embeddings"]
    assert "depthwise kernel" in plan.skipped["depthwise/kernel"]


# ---------------------------------------------------------------- refusals


def test_bad_arguments_are_one_clear_line():
    model = custom_model()
    cases = [
        (dict(final_sparsity=1.5, end_step=10), "final_sparsity=1.5 must be in [0, 1), e.g. 0.8"),
        (dict(final_sparsity=0.5, begin_step=10, end_step=3),
         "end_step=3 is before begin_step=10: pruning must end after it begins"),
        (dict(final_sparsity=0.5), "end_step is missing"),
        (dict(final_sparsity=0.5, end_step=10, frequency=0), "frequency=0 must be a positive"),
        (dict(final_sparsity=0.5, end_step=10, m_by_n=(4, 2)), "m_by_n=(4, 2) must be two"),
        (dict(final_sparsity=0.7, end_step=10, m_by_n=(2, 4)), "leave final_sparsity out"),
        (dict(final_sparsity=0.5, end_step=10, include=("nope",)),
         "include=nope: no such layer, class or path"),
        (dict(final_sparsity=0.5, end_step=10, schedule="cosine"), "schedule='cosine'"),
        (dict(schedule=magnitude.ConstantSparsity(0.5, 0), end_step=3),
         "a schedule object carries its own"),
        (dict(final_sparsity=0.5, end_step=10, exclude=("Dense", "own")), "nothing to prune"),
    ]
    for kwargs, expected in cases:
        with pytest.raises(ConfigError) as info:
            magnitude.prune_magnitude(model, **kwargs)
        assert expected in one_line(info), (kwargs, str(info.value))
    with pytest.raises(ConfigError) as info:
        prune.prune_to_sparsity(model, 0.5, 1, 2, method="bogus")
    assert "method='bogus': use one of auto, tfmot, native" in one_line(info)
    with pytest.raises(ConfigError) as info:
        prune.prune_to_sparsity(small_cnn(), 0.5, 1, 2, PruneConfig(block_size=(1, 4)),
                                method="native")
    assert "block_size=(1, 4) is TF-MOT's: use method='tfmot'" in one_line(info)
    with pytest.raises(UnsupportedLayerError) as info:
        prune.prune_to_sparsity(model, 0.5, 1, 2, PruneConfig(block_size=(1, 4)))
    message = one_line(info)
    assert "needs TF-MOT, which cannot take model 'custom'" in message
    assert "block (Block)" in message and "method='native'" in message


def test_callbacks_made_for_one_model_refuse_another():
    _, callbacks = magnitude.prune_magnitude(custom_model(), 0.5, end_step=4)
    other = compile3(custom_model())
    x, y = random_data(n=16)
    with pytest.raises(ConfigError) as info:
        other.fit(x, y, batch_size=8, callbacks=callbacks, verbose=0)
    assert "these callbacks prune another model" in one_line(info)


# ---------------------------------------------------------------- under a strategy


def test_pruning_under_mirrored_strategy_keeps_the_replicas_pruned():
    strategy = mirrored_strategy()
    with strategy.scope():
        model = small_cnn()
        pruned, callbacks = prune.prune_to_sparsity(model, 0.5, 2, 5, PruneConfig(min_weights=100),
                                                    method="native")
        training.compile_classifier(pruned, training.make_optimizer("adam", 1e-3))
    rng = np.random.default_rng(0)
    pruned.fit(rng.random((160, 8, 8, 1), dtype=np.float32), rng.integers(0, 10, 160),
               batch_size=32, epochs=2, callbacks=callbacks, verbose=0)
    for name in ("conv_1", "dense", "logits"):
        for replica in pruned.get_layer(name).kernel.values:
            assert np.mean(replica.numpy() == 0) == pytest.approx(0.5, abs=0.01), name


# ---------------------------------------------------------------- KerasHub, from configs only


def random_tokens(n, length, vocabulary, seed=0):
    return np.random.default_rng(seed).integers(1, vocabulary, (n, length)).astype("int32")


def test_a_kerashub_gpt2_is_pruned_to_half_and_keeps_generate():
    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=100, num_layers=2, num_heads=4,
                                             hidden_dim=128, intermediate_dim=512,
                                             max_sequence_length=64)
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    compile3(lm)
    assert prune.choose_method(lm) == "native"
    tokens = random_tokens(64, 33, 100)
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((64, 32), bool)}
    lm_, callbacks = prune.prune_to_sparsity(lm, 0.5, 3, 4, PruneConfig(min_weights=0,
                                                                        keep_first_conv=False))
    assert lm_ is lm
    plan = callbacks[0].plan
    decoder = [k for k in plan.kernels if "TransformerDecoder" in k.classes]
    assert len(decoder) == 12  # query, key, value, output, 2 feed-forward; 2 layers
    assert {k.key for k in plan.kernels} - {k.key for k in decoder} == {
        "token_embedding/embeddings"}
    assert "position_embedding" in plan.skipped  # its own weight, not a known kernel: listed
    lm.fit(x, tokens[:, 1:], batch_size=16, epochs=3, callbacks=callbacks, verbose=0)
    assert callbacks[0].step == 12
    for k in plan.kernels:
        assert zeros(k.variable) / k.size == pytest.approx(0.5, abs=0.01), k.key
    stripped = prune.strip_pruning(lm)
    assert type(stripped) is keras_hub.models.GPT2CausalLM and stripped is lm
    report = sparsity.sparsity_report(stripped)
    assert report["pruned"]["layers"] == 13 and report["pruned"]["sparsity"] == 0.5
    prompt = {"token_ids": np.ones((1, 8), "int32"),
              "padding_mask": np.arange(8)[None] < 3}
    out = stripped.generate(prompt, stop_token_ids=None)
    assert out["token_ids"].shape == (1, 8)


def test_a_kerashub_bert_classifier_is_pruned_natively():
    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.BertBackbone(vocabulary_size=100, num_layers=2, num_heads=2,
                                             hidden_dim=32, intermediate_dim=64,
                                             max_sequence_length=16)
    classifier = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=2,
                                                     preprocessor=None)
    compile3(classifier)
    tokens = random_tokens(32, 16, 100)
    x = {"token_ids": tokens, "segment_ids": np.zeros_like(tokens),
         "padding_mask": np.ones_like(tokens, bool)}
    _, callbacks = prune.prune_to_sparsity(classifier, 0.5, 2, 4, PruneConfig(min_weights=1000))
    classifier.fit(x, np.arange(32) % 2, batch_size=8, epochs=2, callbacks=callbacks, verbose=0)
    plan = callbacks[0].plan
    assert sum("TransformerEncoder" in k.classes for k in plan.kernels) == 12
    for k in plan.kernels:
        assert zeros(k.variable) / k.size == pytest.approx(0.5, abs=0.01), k.key
    assert math.isclose(sparsity.sparsity_report(classifier)["pruned"]["sparsity"], 0.5,
                        abs_tol=0.005)


def test_weights_passed_by_hand_are_pruned_and_reported():
    model = compile3(custom_model(own=OwnKernel))
    own = model.get_layer("own").w
    _, callbacks = magnitude.prune_magnitude(model, 0.75, schedule="constant", frequency=1,
                                             kernels=[own])
    x, y = random_data(n=32)
    model.fit(x, y, batch_size=16, callbacks=callbacks, verbose=0)
    assert zeros(own) == 64 * 32 * 3 // 4
    report = sparsity.sparsity_report(model)
    assert [(r["layer"], r["sparsity"]) for r in report["layers"] if r["pruned"]] == [
        ("own", 0.75)]
