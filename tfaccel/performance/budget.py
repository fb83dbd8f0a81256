"""Wall-clock budgets for the timed trials: how long `auto` may take, and steps that stop in time.

`--precision=auto`, `--jit_compile=auto` and `--batch_size=auto` train copies
of the model before the run. Each search gets a budget, by default
`default_budget_seconds(epoch_seconds)`: 10% of one epoch or 60 s, whichever
is larger, so that on any machine the trials cost a small, stated share of the
run. `timed_steps` trains up to N steps and stops after the step that passes a
deadline: TensorFlow cannot stop a step midway, so a deadline is overshot by at
most the one step in flight, which is why the trials check a setting's first
steps on a small batch (`first_step_batch`: 1/32 of it) before they give it
full-size ones.

Example:

    from tfaccel.performance import budget

    seconds = budget.timed_steps(model, train_ds, steps=10, deadline=time.perf_counter() + 5)
"""

import time

from tfaccel import monitor
from tfaccel.errors import ConfigError

MIN_BUDGET_SECONDS = 60.0
"""The smallest default budget of a search: enough to time a few settings on a slow machine."""
BUDGET_SHARE = 0.10
"""The default budget's share of one epoch, when that is larger than `MIN_BUDGET_SECONDS`."""
DEFAULT = "default"
"""`budget_seconds=DEFAULT`: `default_budget_seconds` of the epoch time measured so far."""


def default_budget_seconds(epoch_seconds=None):
    """max(`MIN_BUDGET_SECONDS`, `BUDGET_SHARE` x `epoch_seconds`); 60 s while it is unknown."""
    return max(MIN_BUDGET_SECONDS, BUDGET_SHARE * (epoch_seconds or 0.0))


def resolve_budget(budget_seconds, epoch_seconds=None):
    """Seconds a search may take: a number as given, `DEFAULT` as `default_budget_seconds`,
    None as unlimited (inf).

    Raises:
      ConfigError: a budget that is not positive.
    """
    if budget_seconds is None:
        return float("inf")
    if budget_seconds == DEFAULT:
        return default_budget_seconds(epoch_seconds)
    if isinstance(budget_seconds, bool) or not isinstance(budget_seconds, (int, float)) \
            or not budget_seconds > 0:
        raise ConfigError(f"budget_seconds={budget_seconds!r} is not a time budget: give a "
                          f"number of seconds > 0, {DEFAULT!r} or None (unlimited)")
    return float(budget_seconds)


class _DeadlineTimer(monitor.StepTimer):
    """A `StepTimer` that ends `fit` after the step during which `deadline` passed."""

    def __init__(self, deadline, clock):
        super().__init__()
        self._deadline, self._clock = deadline, clock

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self._clock() >= self._deadline:
            self.model.stop_training = True  # read by fit after each step


def timed_steps(model, dataset, steps, deadline=None, clock=time.perf_counter):
    """Trains a compiled `model` for up to `steps` steps of `dataset.repeat()`; their seconds.

    Training stops early after the step during which `clock()` passed
    `deadline` (at least one step always runs). The first step of a call
    includes tracing (and XLA compilation) for a new input shape. It changes
    the model's weights: pass a copy.

    Args:
      model: a compiled tf_keras model.
      dataset: a batched dataset of `(x, y)`.
      steps: the most steps to run (>= 1).
      deadline: a `clock()` value, or None (run all `steps`).
      clock: the clock `deadline` is on.

    Returns:
      The wall seconds of each step run, in order (between 1 and `steps` values).
    """
    if steps < 1:
        raise ConfigError(f"steps={steps} must be at least 1")
    timer = _DeadlineTimer(float("inf") if deadline is None else deadline, clock)
    model.fit(dataset.repeat(), steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[timer])
    return list(timer.step_seconds)


def first_step_batch(batch_size, multiple=1):
    """The small batch of the first-step check: batch_size / 32 (or the nearest larger
    fraction of it that is a multiple of `multiple`, e.g. replicas x accumulation steps)."""
    for divisor in (32, 16, 8, 4, 2):
        if batch_size % divisor == 0 and (batch_size // divisor) % multiple == 0:
            return batch_size // divisor
    return batch_size
