"""tfaccel.performance.calibrate: peaks measured at three batches in fresh processes, fit."""

import pytest

from tfaccel.performance import calibrate, plan


def test_calibration_batches_are_an_eighth_a_quarter_and_half_of_the_micro_batch():
    assert calibrate.calibration_batches(256) == (32, 64, 128)
    assert calibrate.calibration_batches(2) == (1, 2)  # at least two distinct sizes


def test_fit_line_is_least_squares_and_a_falling_line_counts_as_no_slope():
    slope, fixed = calibrate.fit_line({32: 1_000, 64: 1_640, 128: 2_920})
    assert slope == pytest.approx(20.0) and fixed == 360
    assert calibrate.fit_line({32: 2_000, 64: 1_900}) == (0.0, 2_000)


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
