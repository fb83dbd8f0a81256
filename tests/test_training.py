"""tfaccel.train.training: stopping on a NaN/Inf loss (alone and in every recipe), finished runs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import RECIPES, ROOT, keras_of_flavour

from tfaccel.errors import ConfigError, TfaccelError, TrainingError
from tfaccel.keras import keras
from tfaccel.train import training


class _Epochs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1


def _fit(x, learning_rate=0.1, dtype=None, epochs=3, activation="tanh", flavour="tf_keras"):
    keras = keras_of_flavour(flavour)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)),
                              keras.layers.Dense(8, activation=activation, dtype=dtype),
                              keras.layers.Dense(3, dtype=dtype),
                              keras.layers.Activation("softmax", dtype="float32")])
    model.compile(keras.optimizers.SGD(learning_rate), "sparse_categorical_crossentropy")
    y = np.arange(len(x)) % 3
    counter = _Epochs()
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4), epochs=epochs, verbose=0,
              callbacks=[training.StopOnNonFiniteLoss(), counter])
    return counter


def _data():  # (tanh carries a NaN input through; oneDNN's relu turns it into 0)
    return np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)  # 4 steps per epoch


def test_a_finite_loss_trains_every_step():
    assert _fit(_data()).steps == 12


@pytest.mark.parametrize("where, expected", [
    (9, ("the training loss became nan at epoch 1, step 3 (learning rate 0.1): lower the "
         "learning rate")),  # example 9 is in batch 3: NaN there, after two updates
    (0, ("the training loss was nan at the first step (epoch 1, step 1), before any update: "
         "check the data")),
])
def test_nan_in_the_data_stops_fit_at_that_step(where, expected, flavour):
    x = _data()
    x[where, 0] = np.nan
    with pytest.raises(TrainingError) as error:
        _fit(x, epochs=3, flavour=flavour)
    assert str(error.value).startswith(expected)
    assert isinstance(error.value, TfaccelError)  # recipes turn it into one line and exit 2


@pytest.mark.parametrize("check_every_n_steps, steps_run", [
    (None, 4),  # read at the epoch's end: the epoch's 4 steps ran, no later epoch
    (1, 2),  # read at every step: the callbacks after it saw steps 1 and 2 only
])
def test_the_loss_is_read_when_asked_and_the_first_bad_step_named(check_every_n_steps,
                                                                  steps_run):
    x = _data()
    x[9, 0] = np.nan  # batch 3
    counter = _Epochs()
    with pytest.raises(TrainingError, match=r"became nan at epoch 1, step 3 "):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                                  keras.layers.Activation("softmax")])
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
        model.fit(tf.data.Dataset.from_tensor_slices((x, np.arange(16) % 3)).batch(4),
                  epochs=3, verbose=0,
                  callbacks=[training.StopOnNonFiniteLoss(check_every_n_steps), counter])
    assert counter.steps == steps_run


def test_check_every_n_steps_must_be_positive():
    with pytest.raises(ConfigError, match="check_every_n_steps=0 must be at least 1"):
        training.StopOnNonFiniteLoss(0)


def test_a_huge_learning_rate_stops_fit_naming_the_rate():
    with pytest.raises(TrainingError, match=r"became (nan|inf) at epoch \d+, step \d+ "
                                            r"\(learning rate 1e\+30\): lower the learning rate"):
        _fit(_data(), learning_rate=1e30, epochs=20, activation="relu")


def test_float16_without_loss_scaling_is_named_first():
    x = _data()
    x[6, 1] = np.nan
    with pytest.raises(TrainingError, match=r"at epoch 1, step 2 .*: use loss scaling for "
                                            r"float16 \(tfaccel.wrap_optimizer\)"):
        _fit(x, dtype="mixed_float16")


def test_finished_run_needs_metrics_and_every_export(tmp_path):
    assert training.read_finished_run(tmp_path) is None
    (tmp_path / "model.keras").write_bytes(b"x")
    (tmp_path / "saved_model").mkdir()
    assert training.read_finished_run(tmp_path) is None  # exports without metrics: unfinished
    (tmp_path / "metrics.json").write_text("{\"test_accuracy\": 0.5")
    assert training.read_finished_run(tmp_path) is None  # not valid JSON
    (tmp_path / "metrics.json").write_text(json.dumps({"test_accuracy": 0.5}))
    assert training.read_finished_run(tmp_path) == {"test_accuracy": 0.5}
    (tmp_path / "model.keras").unlink()
    assert training.read_finished_run(tmp_path) is None
    assert training.read_finished_run(tmp_path / "metrics.json") is None  # a file, not a dir


# --- Every recipe stops on a diverging loss: one line, exit 2, no result written.

@pytest.mark.parametrize("recipe, args, result_files", [
    ("train", ["--epochs=3"], ["metrics.json", "model.keras", "saved_model"]),
    pytest.param("prune", ["--epochs=2", "--prune_epochs=1"], ["report.json", "report.md"],
                 marks=pytest.mark.slow),
    pytest.param("optimize", ["--epochs=2"], ["report.json", "report.md"],
                 marks=pytest.mark.slow),
])
def test_recipe_stops_on_a_diverging_loss(tmp_path, recipe, args, result_files):
    model_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, os.path.join(RECIPES, f"{recipe}.py"), *args,
                           "--learning_rate=1e8", f"--model_dir={model_dir}"], env=env, cwd=ROOT,
                          text=True, capture_output=True, timeout=300, check=False)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert "the training loss became" in errors[0] and "lower the learning rate" in errors[0]
    assert "Traceback" not in proc.stderr
    assert "Epoch 2/" not in proc.stdout  # stopped in the first epoch, not run to the end
    written = {os.path.relpath(os.path.join(d, f), model_dir)
               for d, _, files in os.walk(model_dir) for f in files}
    assert not [f for f in result_files if (model_dir / f).exists()], sorted(written)


class _RawWeights(keras.callbacks.Callback):
    """The model's weights after every step (before `fit` swaps in the average)."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps.append([w.numpy().copy() for w in self.model.trainable_weights])


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_ema_ends_fit_with_the_moving_average_of_the_weights(policy):
    from tfaccel.train import precision

    momentum = 0.8
    with precision.precision_scope(policy):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                  keras.layers.Activation("softmax", dtype="float32")])
        optimizer = training.make_optimizer("adam", 0.05, ema_momentum=momentum)
        model.compile(precision.wrap_optimizer(optimizer, policy),
                      "sparse_categorical_crossentropy")
        start = [w.numpy().copy() for w in model.trainable_weights]
        raw = _RawWeights()
        x = np.random.default_rng(0).random((32, 4), dtype=np.float32)
        model.fit(x, np.arange(32) % 3, batch_size=4, epochs=2, verbose=0, callbacks=[raw])
    average = start
    for weights in raw.steps:
        average = [momentum * a + (1 - momentum) * w for a, w in zip(average, weights)]
    assert len(raw.steps) == 16
    for got, want, last in zip(model.trainable_weights, average, raw.steps[-1]):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
        assert not np.allclose(got.numpy(), last)  # the average, not the last step's weights


def test_no_ema_by_default():
    assert not training.make_optimizer("adamw", 1e-3).use_ema
