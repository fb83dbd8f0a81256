"""compress.prune and compress.sparsity: schedules, layer choice, strategy x precision, 2:4,
resume."""

import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored_strategy

from tfaccel import summaries
from tfaccel.compress import prune, sparsity
from tfaccel.errors import ConfigError, UnsupportedLayerError
from tfaccel.keras import keras
from tfaccel.train.models import build_model, load_model_file
from tfaccel.train.training import compile_classifier, make_optimizer

BATCH, STEPS = 32, 5


def small_cnn():
    """A model with every case: a 1-channel first conv, prunable convs and dense, a tiny head."""
    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="conv_0")(inputs)
    x = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv_1")(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(32, activation="relu", name="dense")(x)
    x = keras.layers.Dense(10, name="logits")(x)
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(inputs, outputs, name="small_cnn")


def train_data():
    rng = np.random.default_rng(0)
    x = rng.random((BATCH * STEPS, 8, 8, 1), dtype=np.float32)
    y = (x.reshape(len(x), -1).mean(1) * 10).astype(np.int64) % 10
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)


@pytest.fixture
def policy():
    """Restores the global float32 policy after a test that changes it."""
    yield
    keras.mixed_precision.set_global_policy("float32")


def fit_pruned(model, target, epochs, config=None, strategy=None, **kwargs):
    config = config or prune.PruneConfig(min_weights=100)
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        pruned, callbacks = prune.prune_to_sparsity(model, target, epochs, STEPS, config, **kwargs)
        compile_classifier(pruned, make_optimizer("adam", 1e-3))
    pruned.fit(train_data(), epochs=epochs, callbacks=callbacks, verbose=0)
    return pruned, callbacks


# ---------------------------------------------------------------- schedule and bad input


def test_schedule_steps_come_from_epochs_and_end_on_an_update():
    schedule = prune.make_pruning_schedule(0.8, epochs=10, steps_per_epoch=20)
    assert schedule.begin_step == 0
    assert (schedule.end_step - schedule.begin_step) % schedule.frequency == 0
    assert 120 <= schedule.end_step <= 133  # two thirds of 200 steps, on an update step
    should, value = schedule(tf.constant(schedule.end_step, tf.int64))
    assert bool(should) and float(value) == pytest.approx(0.8)
    assert float(schedule(tf.constant(0, tf.int64))[1]) == pytest.approx(0.0)
    late = prune.make_pruning_schedule(0.5, 4, 10, prune.PruneConfig(begin_epoch=1, end_epoch=3))
    assert (late.begin_step, late.end_step) == (10, 30)
    constant = prune.make_pruning_schedule(0.5, 4, 10, prune.PruneConfig(schedule="constant"))
    assert float(constant(tf.constant(7, tf.int64))[1]) == pytest.approx(0.5)


@pytest.mark.parametrize("target,config,match", [
    (1.0, prune.PruneConfig(), r"target_sparsity=1\.0 must be in \[0, 1\)"),
    (-0.1, prune.PruneConfig(), r"target_sparsity=-0\.1 must be in \[0, 1\)"),
    (0.8, prune.PruneConfig(begin_epoch=3, end_epoch=2), "end_epoch=2 is before begin_epoch=3"),
    (0.8, prune.PruneConfig(end_epoch=12), "end_epoch=12 is after the last epoch"),
    (0.8, prune.PruneConfig(schedule="cubic"), "schedule='cubic'"),
])
def test_bad_schedule_is_one_clear_line(target, config, match):
    with pytest.raises(ConfigError, match=match) as info:
        prune.make_pruning_schedule(target, 10, 20, config)
    assert "\n" not in str(info.value)


def test_bad_layers_and_models_are_one_clear_line():
    model = small_cnn()
    with pytest.raises(UnsupportedLayerError,
                       match="'conv_0'.*input channels divisible by 4.*has 1"):
        prune.plan_pruning(model, prune.PruneConfig(m_by_n=(2, 4), include=("conv_0", "dense")))
    with pytest.raises(ConfigError, match="include=nope: no such layer"):
        prune.plan_pruning(model, prune.PruneConfig(include=("nope",)))
    with pytest.raises(ConfigError, match=r"m_by_n=\(4, 2\) must be two integers 0 < m < n"):
        prune.plan_pruning(model, prune.PruneConfig(m_by_n=(4, 2)))

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__(name="mine")
            self.dense = keras.layers.Dense(10)

        def call(self, x):
            return self.dense(x)

    sub = Subclassed()
    sub(tf.zeros((1, 4)))
    with pytest.raises(UnsupportedLayerError, match="'mine' is a subclassed keras.Model "
                                                    r"\(Subclassed\).*functional API") as info:
        prune.prune_to_sparsity(sub, 0.5, 1, 1)
    assert "\n" not in str(info.value)
    with pytest.raises(UnsupportedLayerError, match="policy='xnnpack' does not fit"):
        prune.plan_pruning(model, prune.PruneConfig(policy="xnnpack"))


def test_default_plan_keeps_first_conv_and_tiny_head_dense_and_says_why():
    model = build_model("cnn", (8, 8, 1), 10)
    plan = prune.plan_pruning(model)
    assert plan.pruned == ("conv_1", "dense")
    assert "first convolution" in plan.skipped["conv_0"]
    assert "1280 weights" in plan.skipped["logits"]
    plan = prune.plan_pruning(model, prune.PruneConfig(m_by_n=(2, 4), keep_first_conv=False))
    assert plan.pruned == ("conv_1", "dense")
    assert "has 1" in plan.skipped["conv_0"]  # 2:4 cannot take 1 input channel: said, not silent
    only = prune.plan_pruning(model, prune.PruneConfig(include=("Dense",), exclude=("logits",)))
    assert only.pruned == ("dense",) and only.skipped["logits"] == "excluded"


def test_xnnpack_policy_prunes_only_1x1_convolutions():
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.ZeroPadding2D(1)(inputs)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="valid", name="stem")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.Conv2D(64, 1, name="pointwise")(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
    x = keras.layers.Flatten()(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(x)
    plan = prune.plan_pruning(keras.Model(inputs, outputs),
                              prune.PruneConfig(policy="xnnpack", min_weights=0))
    assert plan.pruned == ("pointwise",)
    assert "1x1" in plan.skipped["head"]


def test_m_by_n_violations_counts_groups_along_input_channels():
    kernel = np.ones((8, 2), np.float32)  # Dense: 8 inputs -> groups of 4 along axis 0
    kernel[[0, 1, 4, 5], 0] = 0
    kernel[[0, 2, 4, 6], 1] = 0
    assert sparsity.m_by_n_violations(kernel, (2, 4)) == (4, 0)
    kernel[5, 0] = 3.0
    assert sparsity.m_by_n_violations(kernel, (2, 4)) == (4, 1)


# ---------------------------------------------------------------- training: strategy x precision


@pytest.mark.parametrize("strategy_name",
                         ["default", pytest.param("mirrored", marks=pytest.mark.slow)])
@pytest.mark.parametrize("precision", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_pruning_reaches_target(strategy_name, precision, policy, tmp_path):
    keras.mixed_precision.set_global_policy(precision)
    strategy = (mirrored_strategy() if strategy_name == "mirrored"
                else tf.distribute.get_strategy())
    with strategy.scope():
        model = small_cnn()
    epochs = 2
    pruned, _ = fit_pruned(model, 0.75, epochs, strategy=strategy,
                                   log_dir=str(tmp_path / "logs"))
    assert prune.pruning_step(pruned) == epochs * STEPS
    stripped = prune.strip_pruning(pruned)
    report = sparsity.sparsity_report(stripped, ["conv_1", "dense"])
    assert abs(report["pruned"]["sparsity"] - 0.75) < 0.01
    assert {r["layer"]: r["sparsity"] for r in report["layers"]}["conv_0"] == 0.0
    if precision != "float32":
        assert (prune.strip_pruning(pruned, float32=True).get_layer("dense").compute_dtype
                == "float32")
    scalars = summaries.read_scalars(tmp_path / "logs")
    assert [step for step, _ in scalars["sparsity/dense"]] == list(range(epochs))
    assert scalars["sparsity/target"][-1][1] == pytest.approx(0.75)
    assert scalars["sparsity/dense"][-1][1] == pytest.approx(0.75, abs=0.01)


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_masking_keeps_float32_master_weights(precision, policy):
    # TF-MOT masks the half-precision copy and writes it back: with a zero learning rate
    # the kept weights would come back rounded to float16/bfloat16.
    keras.mixed_precision.set_global_policy(precision)
    model = small_cnn()
    pruned, callbacks = prune.prune_to_sparsity(model, 0.5, 1, STEPS,
                                                prune.PruneConfig(min_weights=100))
    compile_classifier(pruned, keras.optimizers.SGD(0.0))
    pruned.fit(train_data(), epochs=1, callbacks=callbacks, verbose=0)
    before = model.get_layer("dense").kernel.numpy()
    after = pruned.get_layer("prune_low_magnitude_dense").get_weights()[0]
    kept = after != 0
    assert 0.45 < 1 - kept.mean() < 0.55
    np.testing.assert_array_equal(after[kept], before[kept])


def test_two_four_pattern_holds_in_the_saved_weights(tmp_path):
    model = small_cnn()
    config = prune.PruneConfig(m_by_n=(2, 4), min_weights=100)
    pruned, _ = fit_pruned(model, 0.5, 1, config)
    sizes = sparsity.model_sizes(prune.strip_pruning(pruned), str(tmp_path), tflite=False)
    saved = keras.models.load_model(sizes["h5"]["path"], compile=False)
    checks = sparsity.check_m_by_n(saved, (2, 4), ["conv_1", "dense", "logits"])
    assert set(checks) == {"conv_1", "dense", "logits"}
    assert all(c["ok"] and c["groups"] > 0 for c in checks.values())
    assert sparsity.sparsity_report(saved, ["conv_1", "dense"])["pruned"]["sparsity"] >= 0.5


def test_block_sparsity_zeroes_whole_blocks_of_dense_kernels_and_convs_element_wise():
    config = prune.PruneConfig(block_size=(1, 4), min_weights=100)
    plan = prune.plan_pruning(small_cnn(), config)
    assert plan.pruned == ("conv_1", "dense", "logits")
    assert plan.element_wise == ("conv_1",)
    pruned, _ = fit_pruned(small_cnn(), 0.5, 1, config)
    stripped = prune.strip_pruning(pruned)
    kernel = stripped.get_layer("dense").kernel.numpy()
    blocks = (kernel.reshape(kernel.shape[0], -1, 4) == 0).sum(-1)
    assert set(np.unique(blocks)) == {0, 4}  # a block is all zeros or has none
    assert (blocks == 4).mean() == pytest.approx(0.5, abs=0.01)
    conv = stripped.get_layer("conv_1").kernel.numpy()
    assert np.mean(conv == 0) == pytest.approx(0.5, abs=0.01)
    blocks = (conv.reshape(-1, 4) == 0).sum(-1)
    assert len(set(np.unique(blocks))) > 2  # element-wise: blocks of 4 partly zero too


@pytest.mark.parametrize("name", ["resnet", "mobilenet_v2"])
def test_default_block_size_prunes_models_without_a_big_dense_layer(name):
    model = build_model(name, (8, 8, 1), 10)
    plan = prune.plan_pruning(model, prune.PruneConfig(block_size=(16, 1)))
    convs = [n for n in plan.pruned if len(model.get_layer(n).kernel.shape) == 4]
    assert convs and set(convs) <= set(plan.element_wise)
    assert not any("block" in reason for reason in plan.skipped.values())


def _odd_model():
    """Every kernel too small for the defaults, and none with input channels divisible by 4."""
    inputs = keras.Input((7, 7, 1))
    x = keras.layers.Conv2D(3, 3, name="conv_0")(inputs)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(10, name="logits")(x), name="odd")


@pytest.mark.parametrize("config,fix,not_fix", [
    (prune.PruneConfig(m_by_n=(2, 4), keep_first_conv=False, min_weights=0),
     "drop m_by_n or pick one whose n divides the input channels", "min_weights"),
    (prune.PruneConfig(), "set keep_first_conv=False, or lower min_weights (now 2048)", "m_by_n"),
    (prune.PruneConfig(keep_first_conv=False, exclude=("logits",)),
     "remove layers from exclude, or lower min_weights (now 2048)", "m_by_n"),
])
def test_nothing_to_prune_names_the_fix_that_matches(config, fix, not_fix):
    with pytest.raises(ConfigError) as info:
        prune.plan_pruning(_odd_model(), config)
    message = str(info.value)
    assert message.startswith("nothing to prune in 'odd': conv_0: ")
    assert message.endswith(fix) and not_fix not in message.split(": ")[-1]


def test_report_of_a_stripped_model_marks_only_the_pruned_layers(tmp_path):
    plan = prune.plan_pruning(small_cnn())
    assert plan.pruned == ("dense",)
    pruned, _ = fit_pruned(small_cnn(), 0.75, 1, prune.PruneConfig())
    stripped = prune.strip_pruning(pruned)
    path = str(tmp_path / "stripped.h5")
    sparsity.save_without_optimizer(stripped, path)
    for model in (stripped, load_model_file(path)):
        report = sparsity.sparsity_report(model)
        assert {r["layer"] for r in report["layers"] if r["pruned"]} == {"dense"}
        assert {r["layer"]: r["zeros"] for r in report["layers"]}["conv_0"] == 0
        assert report["pruned"] == sparsity.sparsity_report(model, plan.pruned)["pruned"]
        assert report["pruned"]["sparsity"] == pytest.approx(0.75, abs=1e-3)
        assert report["all_kernels"]["sparsity"] < report["pruned"]["sparsity"]


def test_nested_models_are_pruned_inside_and_stripped_back():
    from user_models import functional_resnet

    model = functional_resnet((8, 8, 1), 10)
    plan = prune.plan_pruning(model)
    assert {"res1_a_conv", "res2_a_conv", "res2_b_conv"} <= set(plan.pruned)
    pruned, _ = fit_pruned(model, 0.75, 1, prune.PruneConfig())
    inner = pruned.get_layer("res2")
    assert any(hasattr(layer, "pruning_vars") for layer in inner.layers)
    stripped = prune.strip_pruning(pruned)
    assert isinstance(stripped.get_layer("res2"), keras.Model)
    report = sparsity.sparsity_report(stripped)
    assert {r["layer"] for r in report["layers"] if r["pruned"]} == set(plan.pruned)
    assert report["pruned"]["sparsity"] == pytest.approx(0.75, abs=1e-3)


def test_resume_after_interruption_keeps_the_pruning_step(tmp_path):
    base = small_cnn()
    backup = str(tmp_path / "backup")

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 2 * STEPS + 2:
                raise RuntimeError("crash")

    epochs = 4
    with pytest.raises(RuntimeError, match="crash"):
        with tf.distribute.get_strategy().scope():
            pruned, callbacks = prune.prune_to_sparsity(
                base, 0.75, epochs, STEPS, prune.PruneConfig(min_weights=100), backup_dir=backup,
                log_dir=str(tmp_path / "logs"))
            compile_classifier(pruned, make_optimizer("adam", 1e-3))
        pruned.fit(train_data(), epochs=epochs, callbacks=[*callbacks, Crash()], verbose=0)
    assert os.listdir(backup)
    resumed, callbacks = fit_pruned(base, 0.75, epochs, backup_dir=backup,
                                    log_dir=str(tmp_path / "logs2"))
    assert callbacks[-1].start_step == 2 * STEPS  # the epoch-2 backup, not a fresh 0
    assert callbacks[1].resumed_at == (3, 0)
    assert prune.pruning_step(resumed) == epochs * STEPS
    report = sparsity.sparsity_report(prune.strip_pruning(resumed))
    assert abs(report["pruned"]["sparsity"] - 0.75) < 0.01


def test_models_loaded_from_keras_and_saved_model_can_be_pruned(tmp_path):
    model = small_cnn()
    keras_path, saved_path = str(tmp_path / "m.keras"), str(tmp_path / "saved")
    model.save(keras_path)
    model.save(saved_path, save_format="tf")
    for path in (keras_path, saved_path):
        loaded = load_model_file(path)
        pruned, _ = prune.prune_to_sparsity(loaded, 0.5, 2, STEPS,
                                            prune.PruneConfig(min_weights=100))
        wrapped = [layer.layer.name for layer in pruned.layers if hasattr(layer, "pruning_vars")]
        assert wrapped == ["conv_1", "dense", "logits"]
        np.testing.assert_array_equal(pruned.get_layer("prune_low_magnitude_dense").get_weights()[0],
                                      model.get_layer("dense").kernel.numpy())
