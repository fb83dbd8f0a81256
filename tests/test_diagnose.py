"""tfaccel.performance.diagnose: input-bound vs compute-bound, with the model left as it was."""

import json
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored_strategy

from tfaccel import _compat
from tfaccel.data import PipelineConfig
from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.performance import diagnose
from tfaccel.summaries import read_scalars, read_text_summaries


def slow_pipeline(n=256, features=8, batch=32, seconds_per_example=0.002):
    """A deliberately slow input: every example sleeps, one at a time."""
    def sleepy(x):
        time.sleep(seconds_per_example)
        return x

    x = np.random.rand(n, features).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, np.arange(n) % 2))
    ds = ds.map(lambda x, y: (tf.ensure_shape(tf.numpy_function(sleepy, [x], tf.float32),
                                              (features,)), y))
    return ds.batch(batch)


def tiny_model(features=8):
    model = keras.Sequential([keras.Input((features,)),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def heavy_model():
    """A model made artificially expensive: wide convolutions at full resolution."""
    model = keras.Sequential([keras.Input((32, 32, 3)),
                              keras.layers.Conv2D(96, 3, padding="same", activation="relu"),
                              keras.layers.Conv2D(96, 3, padding="same", activation="relu"),
                              keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "sparse_categorical_crossentropy")
    return model


def fast_pipeline(batch=16, batches=40):
    x = tf.random.uniform((batch, 32, 32, 3))
    return tf.data.Dataset.from_tensors((x, tf.zeros((batch,), tf.int64))).repeat(batches)


def test_cheap_model_with_a_slow_pipeline_is_input_bound():
    result = diagnose.diagnose_input(tiny_model(), slow_pipeline(),
                                     config=PipelineConfig(cache="none"),
                                     num_batches=4, warmup=1, repeats=2)
    assert result.verdict == "input-bound"
    # 2 ms per example, serially: at most ~500 examples/s, far below a one-layer model's step.
    assert 0 < result.input_examples_per_sec < 600 < result.step_examples_per_sec
    assert len(result.input_runs) == len(result.step_runs) == 2
    summary = result.summary()
    assert summary.startswith("input-bound:")
    assert (f"{result.input_examples_per_sec:,.0f}" in summary
            and f"{result.step_examples_per_sec:,.0f}" in summary)
    assert "caching" in summary


def test_expensive_model_with_a_fast_pipeline_is_compute_bound():
    result = diagnose.diagnose_input(heavy_model(), fast_pipeline(), num_batches=3, warmup=1,
                                     repeats=2)
    assert result.verdict == "compute-bound"
    assert result.input_examples_per_sec > result.step_examples_per_sec > 0
    assert "Nothing to do on the input side" in result.summary()


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_measuring_the_step_leaves_weights_optimizer_and_metrics_as_they_were(strategy_name):
    strategy = (mirrored_strategy() if strategy_name == "mirrored"
                else tf.distribute.get_strategy())
    with strategy.scope():
        model = tiny_model()
    data = tf.data.Dataset.from_tensor_slices(
        (np.random.rand(64, 8).astype("float32"), np.arange(64) % 2)).batch(16)
    before = [w.copy() for w in model.get_weights()]
    rate, runs = diagnose.measure_step_throughput(model, data, num_steps=4, warmup=1, repeats=2)
    assert rate == max(runs) > 0
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(model.optimizer.iterations.numpy()) == 0
    assert int(_compat.train_counter(model).numpy()) == 0  # Keras's own step count, too
    assert all(float(tf.reduce_sum(tf.abs(v))) == 0 for v in model.optimizer.variables[1:])
    # Training afterwards starts exactly like a fresh copy would.
    model.fit(data, epochs=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 4


def test_step_count_follows_steps_per_execution():
    model = tiny_model()
    assert _compat.steps_per_execution(model) == 1
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy",
                  steps_per_execution=2)
    assert _compat.steps_per_execution(model) == 2
    data = tf.data.Dataset.from_tensor_slices(
        (np.random.rand(64, 8).astype("float32"), np.arange(64) % 2)).batch(16)
    rate, _ = diagnose.measure_step_throughput(model, data, num_steps=4, warmup=2, repeats=1,
                                               restore=False)
    # Each call runs 2 steps: 1 warm-up call and 2 timed calls, 6 optimizer steps in all.
    assert int(model.optimizer.iterations.numpy()) == 6 and rate > 0


def test_suggestions_follow_the_pipeline():
    tips = diagnose.suggest("input-bound", PipelineConfig(cache="none", num_parallel_calls=1,
                                                          image_size=(224, 224)), ratio=0.25)
    assert ("4.0x" in tips and "parallel calls" in tips and "caching" in tips
            and "smaller decode" in tips)
    assert diagnose.suggest("compute-bound").startswith("Nothing to do on the input side")


def test_bad_arguments():
    with pytest.raises(ConfigError, match="num_batches=0"):
        diagnose.measure_input_throughput(fast_pipeline(), num_batches=0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(ConfigError, match="is not compiled"):
        diagnose.measure_step_throughput(model, fast_pipeline())


def test_write_diagnosis_to_tensorboard(tmp_path):
    result = diagnose.InputDiagnosis(100.0, 400.0, "input-bound", "Speed up the input.")
    diagnose.write_diagnosis(str(tmp_path), result)
    assert read_text_summaries(str(tmp_path))["input_diagnosis"] == result.summary()
    scalars = read_scalars(str(tmp_path))
    assert scalars["input_diagnosis/input_examples_per_sec"][0][1] == pytest.approx(100.0)
    assert result.ratio == pytest.approx(0.25)


@pytest.mark.slow
def test_bench_input_recipe_reports_both_numbers_and_the_verdict(recipe, tmp_path):
    out = tmp_path / "bench"
    result = recipe("bench_input", "--num_batches=5", "--warmup=1", "--repeats=2", "--cache=none",
                    f"--model_dir={out}")
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((out / "diagnosis.json").read_text())
    assert report["verdict"] in ("input-bound", "compute-bound")
    assert report["verdict"] == ("input-bound" if report["input_examples_per_sec"]
                                 < report["step_examples_per_sec"] else "compute-bound")
    assert report["verdict"] + ":" in result.stdout and (out / "diagnosis.png").exists()
    assert "input_diagnosis" in read_text_summaries(out / "logs")
