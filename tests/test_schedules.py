"""tfaccel.train.schedules: closed forms, warmup, serialization with a compiled model, the train
recipe."""

import inspect
import math
import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import check_flag_error

from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.summaries import current_learning_rate, read_scalars
from tfaccel.train import schedules

LR = 0.5


def restarts_reference(step, first, t_mul, m_mul, alpha):
    """SGDR by walking the cycles one by one (independent of the closed form)."""
    start, length, cycle = 0.0, float(first), 0
    while step >= start + length:
        start, length, cycle = start + length, length * t_mul, cycle + 1
    frac = (step - start) / length
    return LR * ((1 - alpha) * 0.5 * m_mul ** cycle * (1 + math.cos(math.pi * frac)) + alpha)


def one_cycle_reference(step, total, pct, div, final_div):
    up = round(pct * total)
    low, end = LR / div, LR / div / final_div
    if step < up:
        return LR + (low - LR) * 0.5 * (1 + math.cos(math.pi * step / up))
    frac = min(1.0, (step - up) / (total - up))
    return end + (LR - end) * 0.5 * (1 + math.cos(math.pi * frac))


CASES = {
    "constant": (schedules.ConstantSchedule(LR), lambda s: LR),
    "step": (schedules.StepSchedule(LR, 7, 0.5), lambda s: LR * 0.5 ** (s // 7)),
    "piecewise": (schedules.PiecewiseSchedule([10, 25], [LR, LR / 10, LR / 100]),
                  lambda s: LR if s < 10 else LR / 10 if s < 25 else LR / 100),
    "exponential": (schedules.ExponentialSchedule(LR, 20, 0.3), lambda s: LR * 0.3 ** (s / 20)),
    "exponential_staircase": (schedules.ExponentialSchedule(LR, 20, 0.3, staircase=True),
                              lambda s: LR * 0.3 ** (s // 20)),
    "polynomial": (schedules.PolynomialSchedule(LR, 30, 0.01, power=2.0),
                   lambda s: (LR - 0.01) * (1 - min(s, 30) / 30) ** 2 + 0.01),
    "cosine": (schedules.CosineSchedule(LR, 30, alpha=0.1),
               lambda s: LR * (0.9 * 0.5 * (1 + math.cos(math.pi * min(s, 30) / 30)) + 0.1)),
    "cosine_restarts": (schedules.CosineRestartsSchedule(LR, 8, t_mul=2.0, m_mul=0.5, alpha=0.05),
                        lambda s: restarts_reference(s, 8, 2.0, 0.5, 0.05)),
    "cosine_restarts_t1": (schedules.CosineRestartsSchedule(LR, 8, t_mul=1.0),
                           lambda s: restarts_reference(s, 8, 1.0, 1.0, 0.0)),
    "one_cycle": (schedules.OneCycleSchedule(LR, 40, pct_start=0.25, div_factor=10,
                                             final_div_factor=100),
                  lambda s: one_cycle_reference(s, 40, 0.25, 10, 100)),
    "epoch_exponential": (schedules.EpochExponentialSchedule(LR, steps_per_epoch=5, hold_epochs=3,
                                                             rate=0.2),
                          lambda s: LR * math.exp(-0.2 * max(0, s // 5 - 3 + 1))),
}
STEPS = (0, 1, 5, 7, 9, 10, 14, 15, 19, 20, 24, 25, 29, 30, 33, 39, 45, 60)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_closed_form(name):
    schedule, reference = CASES[name]
    got = [float(schedule(s)) for s in STEPS]
    np.testing.assert_allclose(got, [reference(s) for s in STEPS], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["constant", "cosine", "one_cycle", "epoch_exponential"])
def test_linear_warmup_then_the_schedule_shifted(name):
    schedule, reference = CASES[name]
    warm = type(schedule).from_config({**schedule.get_config(), "warmup_steps": 10,
                                       "warmup_start": 0.01})
    start = reference(0)
    for s in range(10):
        assert float(warm(s)) == pytest.approx(0.01 + (start - 0.01) * s / 10, rel=1e-5)
    for s in (10, 17, 40):
        assert float(warm(s)) == pytest.approx(reference(s - 10), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("name", sorted(CASES))
def test_get_config_round_trip(name):
    schedule, _ = CASES[name]
    # The config holds every constructor argument (`config_keys`) and the warmup's.
    own = set(inspect.signature(type(schedule).__init__).parameters) - {"self", "kwargs"}
    assert set(schedule.get_config()) == own | {"warmup_steps", "warmup_start", "name"}
    clone = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert type(clone) is type(schedule)
    assert clone.get_config() == schedule.get_config()
    assert [float(clone(s)) for s in STEPS] == [float(schedule(s)) for s in STEPS]


def _updates(model, count):
    """`count` optimizer updates (zero gradients: only the step and the schedule move)."""
    for _ in range(count):
        model.optimizer.apply_gradients(
            [(tf.zeros_like(v), v) for v in model.trainable_variables])


@pytest.mark.parametrize("name, fmt", [(n, ".keras") for n in schedules.SCHEDULES]
                         + [("cosine", ".h5"), ("one_cycle", ".h5")])
def test_compiled_model_saves_and_loads_with_the_same_learning_rate(name, fmt, tmp_path):
    schedule = schedules.make_schedule(name, 0.01, steps_per_epoch=2, epochs=4, warmup_epochs=1,
                                       decay_epochs=1, boundaries=[1], multipliers=[1.0, 0.1])
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(schedule), "sparse_categorical_crossentropy")
    k = 5
    _updates(model, k)
    path = str(tmp_path / f"model{fmt}")
    model.save(path)
    loaded = keras.models.load_model(path)
    loaded_schedule = loaded.optimizer._learning_rate
    assert type(loaded_schedule) is type(schedule)
    assert int(loaded.optimizer.iterations.numpy()) == k
    for step in (0, 1, 2, k, 7):
        assert float(loaded_schedule(step)) == pytest.approx(float(schedule(step)), rel=1e-6)
    # One more update each: the loaded model applies the same rate
    # (what the TensorBoard logger reads).
    for m in (model, loaded):
        _updates(m, 1)
        assert current_learning_rate(m.optimizer) == pytest.approx(float(schedule(k)), rel=1e-6)


def test_loss_scale_optimizer_reports_the_schedule():
    schedule = schedules.make_schedule("step", 0.1, steps_per_epoch=2, epochs=3, decay_epochs=1)
    optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(schedule))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer, "mse")
    model.fit(np.ones((6, 3)), np.ones((6, 2)), batch_size=2, epochs=1, verbose=0)
    assert current_learning_rate(model.optimizer) == pytest.approx(float(schedule(2)), rel=1e-6)


def test_make_schedule_lengths_come_from_epochs():
    cosine = schedules.make_schedule("cosine", 1.0, steps_per_epoch=10, epochs=12, warmup_epochs=2)
    assert (cosine.warmup_steps, cosine.decay_steps) == (20, 100)
    step = schedules.make_schedule("step", 1.0, steps_per_epoch=10, epochs=9)
    assert step.step_size == 30
    seed_rule = schedules.make_schedule("epoch_exponential", 1.0, steps_per_epoch=10, epochs=20)
    assert float(seed_rule(99)) == 1.0 and float(seed_rule(100)) == pytest.approx(math.exp(-0.1))


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "triangle"}, "unknown learning-rate schedule 'triangle'"),
    ({"name": "cosine", "warmup_epochs": 5}, "warmup of 5 epochs is not shorter than training"),
    ({"name": "piecewise", "boundaries": [1, 2], "multipliers": [1.0]},
     "2 boundaries need 3 multipliers"),
    ({"name": "step", "decay_epochs": -1}, "decay_epochs=-1 must be > 0"),
])
def test_bad_settings_are_one_clear_line(kwargs, message):
    kwargs = {"learning_rate": 0.1, "steps_per_epoch": 10, "epochs": 5, **kwargs}
    with pytest.raises(ConfigError, match=message) as err:
        schedules.make_schedule(kwargs.pop("name"), **kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_train_recipe_logs_the_scheduled_rate_to_tensorboard(recipe, tmp_path):
    out = tmp_path / "run"
    result = recipe("train", "--epochs=3", "--batch_size=128", "--lr_schedule=step",
                    "--decay_epochs=1", "--decay_rate=0.5", "--warmup_epochs=1",
                    "--learning_rate=0.002",
                    f"--model_dir={out}")
    assert result.returncode == 0, result.stderr[-2000:]
    train = read_scalars(out / "logs" / "train")
    logged = dict(train["learning_rate"])
    # One learning-rate curve in the whole run, one event per step (no Keras epoch_lr or
    # epoch_learning_rate beside it, one step off).
    for run in ("train", "validation"):
        tags = read_scalars(out / "logs" / run)
        assert not [t for t in tags if ("lr" in t or "learning_rate" in t)
                    and t != "learning_rate"], tags
    steps = [step for step, _ in train["learning_rate"]]
    assert steps == sorted(set(steps))
    steps_per_epoch = 10  # ceil(1257 / 128)
    assert {10, 20, 30} <= set(steps)  # each epoch end, at its optimizer step
    inspect = [line for line in result.stdout.splitlines() if line.startswith("inspect:")]
    assert inspect == [f"inspect: tensorboard --logdir {out / 'logs'} --host localhost"]
    expected = schedules.make_schedule("step", 0.002, steps_per_epoch=steps_per_epoch, epochs=3,
                                       warmup_epochs=1, decay_epochs=1, decay_rate=0.5)
    assert max(logged) == 3 * steps_per_epoch and len(logged) >= 3
    for step, value in logged.items():  # the rate of the step-th update, i.e. schedule(step - 1)
        assert value == pytest.approx(float(expected(step - 1)), rel=1e-5)
    assert logged[10] < logged[20] and logged[30] == pytest.approx(0.001, rel=1e-5)


@pytest.mark.parametrize("flags, line", [
    (["--lr_schedule=triangle"], "--lr_schedule=triangle: use one of constant, step, piecewise, "
     "exponential, polynomial, cosine, cosine_restarts, one_cycle, epoch_exponential"),
    (["--lr_schedule=cosine", "--warmup_epochs=3", "--epochs=2"],
     "warmup of 3.0 epochs is not shorter than training (2 epochs): use --warmup_epochs below "
     "--epochs"),
])
def test_train_recipe_rejects_bad_schedule_flags(tmp_path, flags, line):
    # make_schedule's own rules (tfaccel.choices.check_schedule), checked as the flags parse.
    check_flag_error("train", *flags, f"--model_dir={tmp_path / 'run'}", line=line)
    assert not os.path.exists(tmp_path / "run")


def test_a_keras3_optimizer_runs_the_schedule_and_saves_it(tmp_path):
    # tfaccel's schedules are tf_keras ones; a Keras 3 optimizer takes them through the bridge,
    # at the same rate each step, and a saved Keras 3 model loads back with it.
    import keras as k3

    from tfaccel.train import training
    from tfaccel.train.models import load_model_file

    schedule = schedules.make_schedule("cosine", 0.1, steps_per_epoch=4, epochs=3,
                                       warmup_epochs=1)
    model = k3.Sequential([k3.Input((4,)), k3.layers.Dense(2, activation="softmax")])
    optimizer = training.make_optimizer("sgd", schedule, flavour="keras3")
    training.compile_classifier(model, optimizer)
    seen = []

    class Record(k3.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(current_learning_rate(self.model.optimizer))

    model.fit(np.zeros((32, 4), np.float32), np.zeros(32), batch_size=4, epochs=1, verbose=0,
              callbacks=[Record()])
    np.testing.assert_allclose(seen, [float(schedule(s)) for s in range(8)], rtol=1e-6)
    model.save(tmp_path / "m.keras")
    loaded = load_model_file(str(tmp_path / "m.keras"), compile=True)
    assert float(loaded.optimizer.learning_rate) == pytest.approx(float(schedule(8)), rel=1e-6)
    with pytest.raises(Exception, match="optimizer is a tf_keras one"):
        training.compile_classifier(model, training.make_optimizer("sgd", 0.1))
