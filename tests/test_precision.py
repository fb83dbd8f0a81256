"""Mixed precision: policies, float32 outputs, loss scaling, hardware advice, auto selection."""

import json

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_recipe

from tfaccel import data, monitor, summaries
from tfaccel.errors import ConfigError, ModelError
from tfaccel.keras import keras
from tfaccel.performance import precision
from tfaccel.train import models, training


@pytest.fixture(scope="module")
def digits():
    return data.load_dataset("digits")


def _train_digits(splits, model_name, policy, epochs):
    with precision.precision_scope(policy):
        keras.utils.set_random_seed(0)
        model = models.build_model(model_name, splits.info.input_shape, splits.info.num_classes)
        model = precision.apply_precision(model, policy)
        optimizer = precision.wrap_optimizer(training.make_optimizer("adam", 3e-3), policy)
        training.compile_classifier(model, optimizer)
        model.fit(data.batch_dataset(splits.train, 64, training=True), epochs=epochs, verbose=0)
        test = training.evaluate(model, data.batch_dataset(splits.test, 256, training=False))
        probabilities = model(np.zeros((2, *splits.info.input_shape), np.float32))
    return model, test, probabilities


@pytest.mark.parametrize("model_name,policy,epochs", [
    ("mlp", "float32", 6),
    # Emulated on this CPU, hence slow; the CNN adds convolutions under loss scaling.
    pytest.param("mlp", "mixed_float16", 6, marks=pytest.mark.slow),
    pytest.param("mlp", "mixed_bfloat16", 6, marks=pytest.mark.slow),
    pytest.param("cnn", "mixed_float16", 5, marks=pytest.mark.slow),
])
def test_trains_digits_under_each_precision(digits, model_name, policy, epochs):
    model, test, probabilities = _train_digits(digits, model_name, policy, epochs)
    assert test["accuracy"] >= 0.95, test
    assert probabilities.dtype == tf.float32 and model.outputs[0].dtype == tf.float32
    assert np.allclose(probabilities.numpy().sum(axis=1), 1.0, atol=1e-5)
    hidden = {row["layer"]: row for row in precision.layer_dtypes(model)}
    expected = {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
    first = "dense_0" if model_name == "mlp" else "conv_0"
    assert hidden[first]["compute_dtype"] == expected[policy]
    assert hidden[first]["variable_dtype"] == "float32"
    assert hidden["probabilities"]["compute_dtype"] == "float32"
    is_scaled = isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
    assert is_scaled == (policy == "mixed_float16")
    assert keras.mixed_precision.global_policy().name == "float32"  # restored


def test_unknown_precision_is_rejected():
    with pytest.raises(ConfigError, match="unknown precision 'fp8'.*float32, mixed_float16"):
        precision.check_precision("fp8")
    with pytest.raises(ConfigError):
        precision.check_precision("auto")
    assert precision.check_precision("auto", allow_auto=True) == "auto"
    with pytest.raises(ConfigError, match="jit_compile='maybe'"):
        precision.parse_jit_compile("maybe")
    assert [precision.parse_jit_compile(v) for v in ("TRUE", "false", "auto", True)] == [
        True, False, "auto", True]


def test_scope_restores_policy_after_an_error():
    with pytest.raises(RuntimeError), precision.precision_scope("mixed_bfloat16"):
        assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
        raise RuntimeError("boom")
    assert keras.mixed_precision.global_policy().name == "float32"


def _float32_dense_softmax_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")])


def test_loaded_float32_model_is_rebuilt_with_float32_outputs(tmp_path):
    path = str(tmp_path / "m.keras")
    _float32_dense_softmax_model().save(path)
    loaded = keras.models.load_model(path)
    x = np.random.default_rng(0).normal(size=(4, 6)).astype("float32")
    with precision.precision_scope("mixed_float16"):
        converted = precision.apply_precision(loaded, "mixed_float16")
        assert converted is not loaded
        dtypes = [row["compute_dtype"] for row in precision.layer_dtypes(converted)]
        assert dtypes == ["float16", "float32"]  # hidden in float16, the softmax layer in float32
        out = converted(x)
        assert out.dtype == tf.float32
        assert np.allclose(out.numpy(), loaded(x).numpy(), atol=5e-3)  # same weights
        # Built under the policy already: kept as is.
        assert precision.apply_precision(converted, "mixed_float16") is converted
    assert precision.apply_precision(loaded, "float32") is loaded


def test_model_fn_model_without_float32_head_gets_one():
    with precision.precision_scope("mixed_bfloat16"):
        model = _float32_dense_softmax_model()  # built under the policy: ends in bfloat16
        assert model.outputs[0].dtype == tf.bfloat16
        fixed = precision.apply_precision(model, "mixed_bfloat16")
        assert fixed.outputs[0].dtype == tf.float32
        assert fixed.layers[0].compute_dtype == "bfloat16"


def test_subclassed_model_that_does_not_match_is_rejected():
    class Tiny(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(4)
            self.head = keras.layers.Dense(2, dtype="float32")

        def call(self, x):
            return self.head(self.hidden(x))

    model = Tiny()
    model(np.zeros((1, 3), np.float32))
    with pytest.raises(ModelError, match="subclassed model"):
        precision.apply_precision(model, "mixed_float16")  # hidden layer built in float32
    assert precision.apply_precision(model, "float32") is model
    with precision.precision_scope("mixed_float16"):
        built_under_policy = Tiny()
    assert precision.apply_precision(built_under_policy, "mixed_float16") is built_under_policy


def test_wrap_optimizer_only_for_float16():
    sgd = keras.optimizers.SGD(0.1)
    wrapped = precision.wrap_optimizer(sgd, "mixed_float16")
    assert isinstance(wrapped, keras.mixed_precision.LossScaleOptimizer) and wrapped.dynamic
    assert precision.wrap_optimizer(wrapped, "mixed_float16") is wrapped
    assert precision.wrap_optimizer(sgd, "mixed_bfloat16") is sgd
    assert precision.wrap_optimizer(sgd, "float32") is sgd


def test_scaled_gradients_in_a_custom_loop_equal_plain_gradients():
    v = tf.Variable([1.0, -2.0])
    optimizer = precision.wrap_optimizer(keras.optimizers.SGD(0.1), "mixed_float16")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * v) * 1e-6  # small: its float16 gradient would underflow unscaled
    grads = precision.scaled_gradients(tape, loss, [v], optimizer)
    assert np.allclose(grads[0].numpy(), [2e-6, -4e-6], rtol=1e-6)


def test_hardware_advice():
    k80 = [{"name": "Tesla K80", "compute_capability": (3, 7)}]
    v100 = [{"name": "Tesla V100", "compute_capability": (7, 0)}]
    a100 = [{"name": "A100", "compute_capability": (8, 0)}]
    assert "needs >= 7.0" in precision.precision_advice("mixed_float16", gpus=k80)[0]
    assert precision.precision_advice("mixed_float16", gpus=v100) == []
    assert "needs >= 8.0" in precision.precision_advice("mixed_bfloat16", gpus=v100)[0]
    assert precision.precision_advice("mixed_bfloat16", gpus=a100) == []
    assert "no GPU" in precision.precision_advice("mixed_float16", gpus=[])[0]
    assert "no bfloat16 instructions" in precision.precision_advice(
        "mixed_bfloat16", gpus=[], cpu_flags={"avx2"})[0]
    assert precision.precision_advice("mixed_bfloat16", gpus=[], cpu_flags={"amx_bf16"}) == []
    assert precision.precision_advice("float32", gpus=k80) == []


def test_choose_fastest_with_injected_timings():
    base = ("float32", False)
    assert precision.choose_fastest({base: 1.0, ("mixed_float16", False): 0.5}) == (
        "mixed_float16", False)
    assert precision.choose_fastest({base: 1.0, ("mixed_float16", False): 1.2,
                                     ("float32", True): 1.01}) == base
    assert precision.choose_fastest({base: 1.0, ("float32", True): 0.95}, min_speedup=1.1) == base
    with pytest.raises(ConfigError, match="baseline"):
        precision.choose_fastest({("float32", True): 1.0})


def test_auto_select_searches_precision_then_xla(monkeypatch):
    # Injected step times: bfloat16 is fastest, and faster still with XLA.
    fake = {("float32", False): 0.010, ("mixed_float16", False): 0.012,
            ("mixed_bfloat16", False): 0.006, ("mixed_bfloat16", True): 0.004,
            ("mixed_float16", True): 0.013}
    seen = []

    def fake_timing(model, dataset, batch_size, warmup, steps):
        key = (model.layers[1].dtype_policy.name, bool(model._jit_compile))
        seen.append(key)
        return {"seconds_per_step": fake[key], "steps_per_sec": 1 / fake[key],
                "examples_per_sec": batch_size / fake[key]}

    monkeypatch.setattr(monitor, "time_training", fake_timing)
    model = models.build_model("mlp", (8, 8, 1), 10, hidden=(8,))
    choice = precision.auto_select(model, None, batch_size=32)
    assert list(dict.fromkeys(seen)) == [("float32", False), ("mixed_float16", False),
                                         ("mixed_bfloat16", False), ("mixed_bfloat16", True)]
    assert (choice.precision, choice.jit_compile) == ("mixed_bfloat16", True)
    assert [round(r["speedup"], 3) for r in choice.table] == [1.0, 0.833, 1.667, 2.5]
    # 3 interleaved rounds each (bfloat16 without XLA: 3 in stage 1, 3 more against XLA).
    assert [r["rounds"] for r in choice.table] == [3, 3, 6, 3]
    assert keras.mixed_precision.global_policy().name == "float32"
    # A fixed precision with jit auto: only XLA on/off of that precision.
    seen.clear()
    choice = precision.auto_select(model, None, 32, precisions=("mixed_float16",))
    assert list(dict.fromkeys(seen)) == [("mixed_float16", False), ("mixed_float16", True)]
    assert choice.precision == "mixed_float16" and choice.jit_compile is False


def test_auto_select_drops_settings_that_cannot_win(monkeypatch):
    fake = {("float32", False): 0.010, ("mixed_float16", False): 0.050,
            ("mixed_bfloat16", False): 0.011}
    seen = []

    def fake_timing(model, dataset, batch_size, warmup, steps):
        seen.append((model.layers[1].dtype_policy.name, warmup, steps))
        key = (model.layers[1].dtype_policy.name, bool(model._jit_compile))
        return {"seconds_per_step": fake[key], "steps_per_sec": 1 / fake[key],
                "examples_per_sec": batch_size / fake[key]}

    monkeypatch.setattr(monitor, "time_training", fake_timing)
    model = models.build_model("mlp", (8, 8, 1), 10, hidden=(8,))
    choice = precision.auto_select(model, None, 32, jit_options=(False,), warmup=4, steps=7)
    rounds = {r["precision"]: r["rounds"] for r in choice.table}
    assert rounds == {"float32": 3, "mixed_float16": 1, "mixed_bfloat16": 3}  # 5x slower: dropped
    assert seen[:3] == [(p, 4, 1) for p in ("float32", "mixed_float16", "mixed_bfloat16")]
    # Timed rounds: 7 steps each, but float16's round is cut to what fits in 3x float32's
    # (3 * 7 * 10 ms = 210 ms: 4 steps of 50 ms) instead of costing 7 slow steps.
    assert seen[3:] == [(p, 1, n) for p, n in (
        ("float32", 7), ("mixed_float16", 4), ("mixed_bfloat16", 7),
        ("float32", 7), ("mixed_bfloat16", 7), ("float32", 7), ("mixed_bfloat16", 7))]
    assert (choice.precision, choice.jit_compile) == ("float32", False)


@pytest.mark.slow
def test_recipe_auto_keeps_the_fastest_measured_setting(tmp_path):
    # The rule, on any CPU: the setting kept is the fastest of the trial table, unless nothing
    # beat float32 without XLA by MIN_SPEEDUP; never one measured slower than float32. (Without
    # bf16 hardware that is float32; on a CPU with AMX it is mixed_bfloat16.)
    model_dir = tmp_path / "run"
    proc = run_recipe("train", "--precision=auto", "--jit_compile=auto", "--epochs=1",
                      "--monitor_every_n_steps=0", f"--model_dir={model_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    trials = metrics["auto_precision_trials"]
    timings = {(t["precision"], t["jit_compile"]): t["ms_per_step"] for t in trials}
    baseline = timings[precision.BASELINE]
    for t in trials:
        assert t["speedup"] == pytest.approx(baseline / t["ms_per_step"], rel=1e-6), t
    # Stage 1: every precision without XLA; stage 2: XLA for the stage-1 winner.
    stage1 = {k: v for k, v in timings.items() if not k[1]}
    assert sorted(k[0] for k in stage1) == sorted(precision.PRECISIONS)
    winner = precision.choose_fastest(stage1, min_speedup=precision.MIN_SPEEDUP)
    assert [(t["precision"], t["jit_compile"]) for t in trials[3:]] == [(winner[0], True)]
    fastest = min(timings, key=timings.get)
    expected = fastest if baseline / timings[fastest] >= precision.MIN_SPEEDUP else \
        precision.BASELINE
    chosen = (metrics["precision"], metrics["jit_compile"])
    assert chosen == expected, trials
    assert timings[chosen] <= baseline  # never slower than float32 as measured
    assert f"auto chose precision {chosen[0]}, jit_compile {chosen[1]}" in proc.stdout
    assert "| mixed_bfloat16 | False |" in proc.stdout  # the measured table, in the log
    texts = summaries.read_text(model_dir / "logs" / "train")
    assert texts["performance/auto_precision"].count("\n") == len(trials) + 1
    images = summaries.read_image_tags(model_dir / "logs" / "train")
    assert "performance/auto_precision_plot" in images
    assert (model_dir / "auto_precision.png").stat().st_size > 1000
