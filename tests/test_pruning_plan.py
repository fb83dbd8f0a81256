"""compress.pruning_plan: schedules from epochs, which layers are pruned and why, bad input."""

import pytest
import tensorflow as tf

from tfaccel.compress import prune, pruning_plan
from tfaccel.compress.pruning_plan import PruneConfig
from tfaccel.errors import ConfigError, ModelError, UnsupportedLayerError
from tfaccel.keras import keras
from tfaccel.train.models import build_model


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


def test_schedule_steps_come_from_epochs_and_end_on_an_update():
    schedule = pruning_plan.make_pruning_schedule(0.8, epochs=10, steps_per_epoch=20)
    assert schedule.begin_step == 0
    assert (schedule.end_step - schedule.begin_step) % schedule.frequency == 0
    assert 120 <= schedule.end_step <= 133  # two thirds of 200 steps, on an update step
    should, value = schedule(tf.constant(schedule.end_step, tf.int64))
    assert bool(should) and float(value) == pytest.approx(0.8)
    assert float(schedule(tf.constant(0, tf.int64))[1]) == pytest.approx(0.0)
    late = pruning_plan.make_pruning_schedule(0.5, 4, 10, PruneConfig(begin_epoch=1, end_epoch=3))
    assert (late.begin_step, late.end_step) == (10, 30)
    constant = pruning_plan.make_pruning_schedule(0.5, 4, 10, PruneConfig(schedule="constant"))
    assert float(constant(tf.constant(7, tf.int64))[1]) == pytest.approx(0.5)


@pytest.mark.parametrize("target,config,match", [
    (1.0, PruneConfig(), r"target_sparsity=1\.0 must be in \[0, 1\)"),
    (-0.1, PruneConfig(), r"target_sparsity=-0\.1 must be in \[0, 1\)"),
    (0.8, PruneConfig(begin_epoch=3, end_epoch=2), "end_epoch=2 is before begin_epoch=3"),
    (0.8, PruneConfig(end_epoch=12), "end_epoch=12 is after the last epoch"),
    (0.8, PruneConfig(schedule="cubic"), "schedule='cubic'"),
])
def test_bad_schedule_is_one_clear_line(target, config, match):
    with pytest.raises(ConfigError, match=match) as info:
        pruning_plan.make_pruning_schedule(target, 10, 20, config)
    assert "\n" not in str(info.value)


def test_bad_layers_and_models_are_one_clear_line():
    model = small_cnn()
    with pytest.raises(UnsupportedLayerError,
                       match="'conv_0'.*input channels divisible by 4.*has 1"):
        pruning_plan.plan_pruning(model, PruneConfig(m_by_n=(2, 4), include=("conv_0", "dense")))
    with pytest.raises(ConfigError, match="include=nope: no such layer"):
        pruning_plan.plan_pruning(model, PruneConfig(include=("nope",)))
    with pytest.raises(ConfigError, match=r"m_by_n=\(4, 2\) must be two integers 0 < m < n"):
        pruning_plan.plan_pruning(model, PruneConfig(m_by_n=(4, 2)))

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
        prune.prune_to_sparsity(sub, 0.5, 1, 1, method="tfmot")  # "auto" prunes it natively
    assert "\n" not in str(info.value)
    with pytest.raises(UnsupportedLayerError, match="policy='xnnpack' does not fit"):
        pruning_plan.plan_pruning(model, PruneConfig(policy="xnnpack"))
    pruned, _ = prune.prune_to_sparsity(model, 0.5, 1, 2, PruneConfig(min_weights=100))
    with pytest.raises(ModelError, match="'small_cnn' is already pruned "
                                         r"\(layers prune_low_magnitude_conv_1, .*strip_pruning"):
        pruning_plan.plan_pruning(pruned)


def test_default_plan_keeps_first_conv_and_tiny_head_dense_and_says_why():
    model = build_model("cnn", (8, 8, 1), 10)
    plan = pruning_plan.plan_pruning(model)
    assert plan.pruned == ("conv_1", "dense")
    assert "first convolution" in plan.skipped["conv_0"]
    assert "1280 weights" in plan.skipped["logits"]
    plan = pruning_plan.plan_pruning(model, PruneConfig(m_by_n=(2, 4), keep_first_conv=False))
    assert plan.pruned == ("conv_1", "dense")
    assert "has 1" in plan.skipped["conv_0"]  # 2:4 cannot take 1 input channel: said, not silent
    only = pruning_plan.plan_pruning(model, PruneConfig(include=("Dense",), exclude=("logits",)))
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
    plan = pruning_plan.plan_pruning(keras.Model(inputs, outputs),
                              PruneConfig(policy="xnnpack", min_weights=0))
    assert plan.pruned == ("pointwise",)
    assert "1x1" in plan.skipped["head"]



@pytest.mark.parametrize("name", ["resnet", "mobilenet_v2"])
def test_default_block_size_prunes_models_without_a_big_dense_layer(name):
    model = build_model(name, (8, 8, 1), 10)
    plan = pruning_plan.plan_pruning(model, PruneConfig(block_size=(16, 1)))
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
    (PruneConfig(m_by_n=(2, 4), keep_first_conv=False, min_weights=0),
     "drop m_by_n or pick one whose n divides the input channels", "min_weights"),
    (PruneConfig(), "set keep_first_conv=False, or lower min_weights (now 2048)", "m_by_n"),
    (PruneConfig(keep_first_conv=False, exclude=("logits",)),
     "remove layers from exclude, or lower min_weights (now 2048)", "m_by_n"),
])
def test_nothing_to_prune_names_the_fix_that_matches(config, fix, not_fix):
    with pytest.raises(ConfigError) as info:
        pruning_plan.plan_pruning(_odd_model(), config)
    message = str(info.value)
    assert message.startswith("nothing to prune in 'odd': conv_0: ")
    assert message.endswith(fix) and not_fix not in message.split(": ")[-1]


def test_plan_names_keep_resolving_from_the_pruning_module():
    # `tfaccel.compress.prune` (and the flat `tfaccel.prune`) still offers the planning names.
    import tfaccel.prune

    for name in ("PruneConfig", "PruningPlan", "plan_pruning", "make_pruning_schedule"):
        assert getattr(prune, name) is getattr(pruning_plan, name)
        assert getattr(tfaccel.prune, name) is getattr(pruning_plan, name)
    assert pruning_plan.check_sparsity(0.5) == 0.5
    with pytest.raises(ConfigError, match=r"--sparsity=True must be in \[0, 1\)"):
        pruning_plan.check_sparsity(True, "--sparsity")
