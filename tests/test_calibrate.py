"""tfaccel.performance.calibrate: peaks of `fit` at three batches, one fresh process each, fit."""

import dataclasses
import os

import pytest

from tfaccel.errors import ConfigError
from tfaccel.performance import calibrate, plan


def test_calibration_batches_are_an_eighth_a_quarter_and_half_of_the_micro_batch():
    assert calibrate.calibration_batches(256) == (32, 64, 128)
    assert calibrate.calibration_batches(2) == (1, 2)  # at least two distinct sizes


def test_fit_line_is_least_squares_and_a_falling_line_counts_as_no_slope():
    slope, fixed = calibrate.fit_line({32: 1_000, 64: 1_640, 128: 2_920})
    assert slope == pytest.approx(20.0) and fixed == 360
    assert calibrate.fit_line({32: 2_000, 64: 1_900}) == (0.0, 2_000)


def test_the_graph_shifted_to_the_largest_peak_predicts_where_it_bends_above_the_line():
    peaks = {32: 1_000, 64: 1_100, 128: 1_300}  # the line: 1,700 at 256
    line = round(sum(calibrate.fit_line(peaks)[i] * (256, 1)[i] for i in range(2)))
    bends = {32: 1_100, 64: 1_150, 128: 1_500, 256: 2_300}  # an update phase, then activations
    assert calibrate.predict(peaks, 256, bends) == (2_100, line, 2_100)  # 2,300 - (1,500 - 1,300)
    flat = {32: 900, 64: 1_000, 128: 1_200, 256: 1_400}
    assert calibrate.predict(peaks, 256, flat) == (line, line, 1_500)
    assert calibrate.predict(peaks, 256) == (line, line, 0)  # no graph: the line
    with pytest.raises(ConfigError, match="planned bytes at batches"):
        calibrate.measure_memory("mlp", plan.PlanSettings(batch_size=256).checked(), (8, 8, 1),
                                 10, graph={256: 1}, batches=(32, 64))


@pytest.mark.slow
def test_a_keras_3_model_with_two_inputs_is_measured_in_fresh_processes(tmp_path):
    keras = pytest.importorskip("keras")
    left, right = keras.Input((16,), name="left"), keras.Input((16,), name="right")
    hidden = keras.layers.Dense(256, activation="relu")(keras.layers.Concatenate()([left, right]))
    model = keras.Model([left, right], keras.layers.Dense(4)(hidden))
    c = calibrate.measure_memory(model, plan.PlanSettings(batch_size=512, optimizer="sgd")
                                 .checked(), repeats=1)
    assert set(c.peaks) == {64, 128, 256}
    # each example keeps at least its 256 hidden floats (and its ReLU's output) in the step
    assert c.per_example >= 4 * 256
    assert c.predicted == round(c.fixed + 512 * c.per_example)
    # each process traced two more steps: the allocator's chunks beyond the bytes asked for
    assert set(c.slack) == {64, 128, 256} and all(0 <= f < 1 for f in c.slack.values())


def test_each_batch_is_measured_in_its_own_processes_and_its_largest_peak_counts(monkeypatch):
    specs, peaks = [], iter([100, 300, 900, 120, 280, 1_000])  # two rounds of 3 batches

    slacks = iter([10, 0, 50, 30, 20, 0])  # bytes beyond the asked; none traced for the last

    def child(spec):
        specs.append(spec)
        peak, slack = next(peaks), next(slacks)
        return {"peak": peak, "traced_peak": peak, "slack": slack} if slack else {"peak": peak}

    monkeypatch.setattr(calibrate, "_run_child", child)
    settings = plan.PlanSettings(batch_size=1024, optimizer="adam", grad_accum_steps=4,
                                 precision="mixed_bfloat16").checked()
    c = calibrate.measure_memory("mlp", settings, (8, 8, 1), 10, steps=5, repeats=2)
    # one batch per fresh process, the micro-batch's 1/8, 1/4 and 1/2, with the run's settings
    assert [s["batch"] for s in specs] == [32, 64, 128] * 2
    assert {(s["steps"], s["optimizer"], s["precision"], s["model"], s["grad_accum_steps"])
            for s in specs} == {(5, "adam", "mixed_bfloat16", "mlp", 4)}
    assert c.peaks == {32: 120, 64: 300, 128: 1_000}
    assert c.spread == pytest.approx(0.2)  # 120 / 100 - 1, the largest of the three
    # the largest slack per batch, of the bytes asked for (peak - slack); a process without a
    # trace adds none
    assert c.slack == pytest.approx({32: 30 / 90, 64: 20 / 260, 128: 50 / 850})
    assert c.processes[64] == [{"peak": 300}, {"peak": 280, "traced_peak": 280, "slack": 20}]
    text = plan.format_plan(dataclasses.replace(plan.plan_memory("mlp", settings, input_shape=(
        8, 8, 1), num_classes=10), measured=c))
    assert ("at a traced peak the allocator held 6-33% more than the tensors asked for "
            "(chunks served whole)") in text
    assert f"+ {c.per_example / 1e3:,.2f} KB per example" in text  # not "0.00 MB"
    per_example, fixed = calibrate.fit_line(c.peaks)
    # the micro-batch (256) scaled: each process trained whole batches of 4 micro-batches, so
    # the accumulator and the batch the dataset yields are in its peaks
    assert c.predicted == round(fixed + 256 * per_example)
    assert "batches 32, 64, 128 in batches of 4 micro-batches" in c.method
    assert "largest peak of 2" in c.method


def test_under_accumulation_each_process_trains_whole_batches_of_micro_batches():
    # the zoo MLP on 32 x 32 x 3 inputs (12 KB an example, few activations): under 4-step
    # accumulation the dataset yields batches of 4 x 64, which the peak must hold
    spec = {"model": "mlp", "input_shape": [32, 32, 3], "num_classes": 10,
            "precision": "float32", "optimizer": "sgd", "sequence_length": None, "steps": 2,
            "batch": 64}
    plain = calibrate._run_child(dict(spec, grad_accum_steps=1))["peak"]
    accumulated = calibrate._run_child(dict(spec, grad_accum_steps=4))["peak"]
    three_more_inputs = 3 * 64 * 32 * 32 * 3 * 4
    assert accumulated - plain > three_more_inputs


def test_a_keras_hub_causal_lm_is_measured_without_its_own_metrics(tmp_path):
    # GPT2CausalLM compiles with a token accuracy by default, which would compare its
    # (batch, length, vocabulary) outputs with the (batch,) labels the child feeds
    from hub_models import gpt2_and_bert

    gpt2, _ = gpt2_and_bert()
    path = str(tmp_path / "gpt2.keras")
    gpt2.save(path)
    spec = {"model": path, "input_shape": None, "num_classes": None, "precision": "float32",
            "optimizer": "adam", "sequence_length": 16, "steps": 2, "grad_accum_steps": 1}
    small, large = (calibrate._run_child(dict(spec, batch=b))["peak"] for b in (2, 8))
    weights = 4 * gpt2.count_params()
    assert small > 4 * weights  # weights, gradients and Adam's two slots
    assert large > small


@pytest.mark.slow
def test_a_child_runs_tensorflows_own_cpu_kernels_when_asked():
    # oneDNN off, as on an AVX2-only CPU: the zoo CNN's convolution gradients keep column
    # buffers (28 MB at once at batch 256) that oneDNN's kernels do not
    spec = {"model": "cnn", "input_shape": [8, 8, 1], "num_classes": 10,
            "precision": "float32", "optimizer": "sgd", "sequence_length": None, "steps": 2,
            "batch": 256, "grad_accum_steps": 1}
    off = calibrate._run_child(dict(spec, onednn=False))["peak"]
    on = calibrate._run_child(dict(spec, onednn=True))["peak"]
    assert off - on > 20e6, (off, on)
    assert calibrate._child_env(None).get("TF_ENABLE_ONEDNN_OPTS") == \
        os.environ.get("TF_ENABLE_ONEDNN_OPTS")
