"""Model and pipeline parallelism (tfaccel.parallel.pipeline) on logical CPU devices.

The property GPipe promises and these tests check: a split model trained on micro-batches
makes the same updates as the unsplit model on whole batches (plain SGD, fixed seed),
with its variables and its ops on the devices of their stages.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import NUM_CPU_DEVICES, ROOT

from tfaccel import doctor
from tfaccel.errors import ConfigError, ModelError
from tfaccel.keras import keras
from tfaccel.parallel import pipeline, stages
from tfaccel.train.models import build_model


def cpu_devices():
    """The logical CPUs conftest.py made (listed on use: listing initializes TensorFlow)."""
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def residual_model():
    """A functional model whose residual connections cross stage boundaries."""
    inputs = keras.Input((8, 8, 1), name="image")
    x = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name="stem")(inputs)
    for i in range(2):
        y = keras.layers.Conv2D(8, 3, padding="same", activation="relu", name=f"a{i}")(x)
        y = keras.layers.Conv2D(8, 3, padding="same", name=f"b{i}")(y)
        x = keras.layers.ReLU(name=f"out{i}")(keras.layers.Add(name=f"add{i}")([x, y]))
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(x)
    return keras.Model(inputs, outputs, name="residual")


def digits_cnn():
    # Dropout masks are random per micro-batch; exact equality needs a deterministic model.
    return build_model("cnn", (8, 8, 1), 10, dropout=0.0)


MODELS = {"cnn": digits_cnn, "residual": residual_model}


def batches(steps=6, batch=32, distinct=3):
    """Batches of the bundled digits (real data), the `distinct` first ones cycled."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images[:, :, :, None] / 16.0).astype("float32")
    return [(x[j * batch:(j + 1) * batch], digits.target[j * batch:(j + 1) * batch])
            for j in (i % distinct for i in range(steps))]


def train_both(make, num_stages, micro_batches, recompute=False, optimizer=None,
               devices=None):
    """Per-step losses and final weights of the unsplit and the split model."""
    keras.utils.set_random_seed(1)
    model = make()
    staged = pipeline.pipeline_parallel(model, num_stages=num_stages,
                                        devices=devices or cpu_devices()[:NUM_CPU_DEVICES],
                                        micro_batches=micro_batches, recompute=recompute)
    results = []
    for m in (model, staged):
        m.compile((optimizer or (lambda: keras.optimizers.SGD(0.1)))(),
                  "sparse_categorical_crossentropy")
        losses = [float(m.train_on_batch(x, y)) for x, y in batches()]
        results.append((losses, (m.placed if m is staged else m).get_weights(), m.optimizer))
    return results, staged


def micro_batch_atol(micro_batches):
    """How far the split model's weights may end from the unsplit one's after `batches()`.

    Micro-batches change the kernels' summation order, and so, with oneDNN off
    (TensorFlow's own kernels: its default on AVX2-only CPUs), does the split itself: the
    residual model's weights drift up to 3.5e-5 apart in 6 steps at lr 0.1, one micro-batch
    or several (under 1e-6 with oneDNN and one micro-batch); a micro-batch's gradient missed
    or counted twice moves them by 1e-2.
    """
    return 1e-6 if micro_batches == 1 and doctor.onednn_enabled() else 1e-4


def assert_same_training(results, rtol=1e-5, atol=1e-6, trained=True):
    (losses, weights, _), (split_losses, split_weights, _) = results
    np.testing.assert_allclose(split_losses, losses, rtol=rtol)
    assert losses[3] < losses[0] or not trained  # the same batch, one pass later
    for a, b in zip(weights, split_weights):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)


# Recomputation with micro-batches runs in the slow tier (and on 4 devices below).
@pytest.mark.parametrize("name,micro_batches,recompute", [
    pytest.param(name, m, rec, id=f"{name}-{m}-{'recompute' if rec else 'stored'}",
                 marks=[pytest.mark.slow] if rec and m > 1 else [])
    for name in sorted(MODELS) for m in (1, 2, 4) for rec in (False, True)])
def test_split_training_equals_the_unsplit_model(name, micro_batches, recompute):
    results, staged = train_both(MODELS[name], NUM_CPU_DEVICES, micro_batches, recompute)
    assert_same_training(results, atol=micro_batch_atol(micro_batches))
    assert len(staged.plan.stages) == NUM_CPU_DEVICES


def test_each_stage_keeps_its_variables_and_optimizer_slots_on_its_device():
    results, staged = train_both(residual_model, 2, 2, optimizer=lambda: keras.optimizers.Adam())
    # Adam moves each weight by up to 6e-3 in these 6 steps; the AVX2-only drift is 2.9e-5.
    assert_same_training(results, rtol=1e-4, atol=1e-4)
    for stage in staged.plan.stages:
        for name in stage.layers:
            for v in staged.placed.get_layer(name).variables:
                assert v.device.endswith(stage.device.split("device:")[-1]), (v.name, v.device)
    slots = 0
    for v in staged.placed.trainable_variables:  # Adam's m/<name> and v/<name>
        for slot in staged.optimizer.variables:
            if slot.name.endswith("/" + v.name):
                assert slot.device == v.device, (slot.name, slot.device, v.device)
                slots += 1
    assert slots == 2 * len(staged.placed.trainable_variables)


def stage_ops(staged):
    """{stage: [(op name, op device)]} of the ops under each stage's name scope in the traced
    train step (a variable's reads run where it lives: checked from the variables)."""
    if not staged.optimizer:
        staged.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    x, y = batches(1)[0]
    graph = tf.function(staged.train_step).get_concrete_function(
        (tf.constant(x), tf.constant(y))).graph
    found = {k: [] for k in range(len(staged.plan.stages))}
    for op in graph.get_operations():  # backward ops: gradient_tape/stage_<k>/...
        k = op.name.removeprefix("gradient_tape/").split("/")[0].removeprefix("stage_")
        if k.isdigit() and op.type not in ("NoOp", "Const", "Placeholder", "ReadVariableOp"):
            found[int(k)].append((op.name, op.device))
    return found


def misplaced_ops(staged):
    return [(name, device) for k, ops in stage_ops(staged).items() for name, device in ops
            if not device.endswith(staged.plan.stages[k].device.split("device:")[-1])]


def test_each_stage_runs_its_forward_and_backward_ops_on_its_device():
    keras.utils.set_random_seed(1)
    staged = pipeline.pipeline_parallel(residual_model(), num_stages=2, devices=cpu_devices(),
                                        micro_batches=2)
    ops = stage_ops(staged)
    assert misplaced_ops(staged) == []
    assert all(len(ops[k]) > 10 for k in ops)
    assert all(any(name.startswith(f"gradient_tape/stage_{k}/micro_batch_1/")
                   for name, _ in ops[k]) for k in ops)  # the backward, on the same device
    assert all(any("/micro_batch_1/" in name for name, _ in ops[k]) for k in ops)


def test_recompute_runs_the_stage_forward_again_in_the_backward_pass():
    def convolutions(recompute):
        staged = pipeline.pipeline_parallel(residual_model(), num_stages=2,
                                            devices=cpu_devices(), recompute=recompute)
        staged.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
        x, y = batches(1)[0]
        graph = tf.function(staged.train_step).get_concrete_function(
            (tf.constant(x), tf.constant(y))).graph
        return sum(op.type == "Conv2D" for op in graph.get_operations())

    assert convolutions(True) > convolutions(False)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.slow
def test_mixed_precision_scales_the_loss_once_per_batch(policy):
    from tfaccel.train import precision

    precision.set_precision(policy)
    try:
        results, staged = train_both(residual_model, 2, 4, optimizer=lambda: (
            precision.wrap_optimizer(keras.optimizers.SGD(0.1), policy)))
    finally:
        precision.set_precision("float32")
    # 16-bit activations summed over micro-batches instead of the batch: close, not equal;
    # float16's first steps may be skipped while the loss scale falls (no training then).
    # bfloat16 in TensorFlow's own kernels (oneDNN off: an AVX2-only CPU's default) rounds
    # further: two of the 8 head biases ended 0.042 apart there (within 2e-3 with oneDNN
    # and AVX512_BF16/AMX).
    native = doctor.onednn_enabled() and bool({"avx512_bf16", "amx_bf16"} &
                                              set(doctor.cpu_flags()))
    atol = 5e-2 if policy == "mixed_bfloat16" and not native else 2e-3
    assert_same_training(results, rtol=2e-2, atol=atol, trained=False)
    assert int(staged.optimizer.iterations) == 6  # one update per batch, not per micro-batch
    if policy == "mixed_float16":
        assert isinstance(staged.optimizer, keras.mixed_precision.LossScaleOptimizer)


@pytest.mark.slow
def test_a_schedule_steps_once_per_batch():
    from tfaccel.train import schedules

    schedule = schedules.make_schedule("cosine", 0.1, steps_per_epoch=6, epochs=2)
    results, staged = train_both(residual_model, 2, 4,
                                 optimizer=lambda: keras.optimizers.SGD(schedule))
    assert_same_training(results)
    unsplit_lr = float(results[0][2].learning_rate)
    assert int(staged.optimizer.iterations) == 6  # the schedule's step: one per batch
    assert float(staged.optimizer.learning_rate) == pytest.approx(unsplit_lr, rel=1e-6)
    assert unsplit_lr < 0.1


@pytest.mark.slow
def test_batchnorm_model_matches_without_micro_batches():
    results, _ = train_both(lambda: build_model("resnet", (8, 8, 1), 10), 2, 1)
    assert_same_training(results, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_saving_the_pipeline_saves_the_functional_model(tmp_path):
    _, staged = train_both(residual_model, 2, 2)
    path = str(tmp_path / "model.keras")
    staged.save(path)
    loaded = keras.models.load_model(path, compile=False)
    x = batches(1)[0][0]
    np.testing.assert_allclose(loaded.predict(x, verbose=0), staged.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)
    assert type(loaded).__name__ == "Functional"


def test_bad_input_gets_one_clear_line():
    model = residual_model()
    with pytest.raises(ConfigError, match="more than the model's 11 layers"):
        pipeline.pipeline_parallel(model, num_stages=12, devices=cpu_devices() * 6)
    with pytest.raises(ConfigError, match="'nope' is not a layer"):
        pipeline.pipeline_parallel(model, boundaries=["nope"], devices=cpu_devices())
    with pytest.raises(ConfigError, match="does not divide the batch of 30"):
        pipeline.pipeline_parallel(model, num_stages=2, devices=cpu_devices(), micro_batches=4,
                                   batch_size=30)
    with pytest.raises(ConfigError, match="only 2 device"):
        pipeline.pipeline_parallel(model, num_stages=3, devices=cpu_devices())
    with pytest.raises(ConfigError, match="recompute with layer"):
        pipeline.pipeline_parallel(build_model("cnn", (8, 8, 1), 10), num_stages=2,
                                   devices=cpu_devices(), recompute=True)

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(ModelError, match="subclassed Subclassed.*functional or Sequential"):
        pipeline.pipeline_parallel(Subclassed(), num_stages=2, devices=cpu_devices())
    with pytest.raises(ConfigError, match="inside a tf.distribute strategy"):
        with tf.distribute.OneDeviceStrategy("/CPU:0").scope():
            pipeline.pipeline_parallel(model, num_stages=2, devices=cpu_devices())


_FOUR_DEVICES = """
import json, sys
import tensorflow as tf
sys.path.insert(0, {tests!r})
import test_pipeline_parallel as t  # its conftest splits the CPU in 2: split it in 4 instead
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 4)
devices = [d.name for d in tf.config.list_logical_devices("CPU")]
out = {{}}
for name, micro_batches, recompute in {cases!r}:
    results, staged = t.train_both(t.MODELS[name], 4, micro_batches, recompute, devices=devices)
    t.assert_same_training(results, atol=t.micro_batch_atol(micro_batches))
    out[f"{{name}}/{{micro_batches}}/{{recompute}}"] = {{
        "losses": results[1][0],
        "stage_devices": [s.device[-5:] for s in staged.plan.stages],
        "misplaced": [v.name for s in staged.plan.stages for n in s.layers
                      for v in staged.placed.get_layer(n).variables
                      if not v.device.endswith(s.device[-5:])],
        "passed_along": [r for s in staged.plan.stages for r in s.receives if r[2]],
        "ops_misplaced": t.misplaced_ops(staged)}}
print(json.dumps(out))
"""


@pytest.mark.slow
def test_four_logical_devices_train_like_the_unsplit_model():
    cases = [(name, m, rec) for name in sorted(MODELS) for m in (1, 2, 4)
             for rec in (False, True) if m == 4 or not rec]
    script = _FOUR_DEVICES.format(tests=os.path.join(ROOT, "tests"), cases=cases)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get(
        "PYTHONPATH")])), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(out) == len(cases)
    for key, got in out.items():
        assert got["stage_devices"] == ["CPU:0", "CPU:1", "CPU:2", "CPU:3"], key
        assert got["misplaced"] == [] and got["ops_misplaced"] == [], key
    # the residual model's skip connections cross a stage that only forwards them
    assert any(out[k]["passed_along"] for k in out if k.startswith("residual"))


def test_stage_plan_is_what_the_pipeline_runs():
    staged = pipeline.pipeline_parallel(residual_model(), boundaries=["a1"],
                                        devices=cpu_devices(), micro_batches=2)
    assert staged.plan.stages[1].layers[0] == "a1"
    assert stages.StagePlan.bubble_fraction.fget(staged.plan) == pytest.approx(1 / 3)
