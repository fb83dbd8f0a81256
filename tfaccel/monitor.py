"""Watching what training costs: step times, and GPU or CPU load in TensorBoard.

`HardwareMonitor` samples GPU utilization and memory through NVML
(nvidia-ml-py) when GPUs are visible, and CPU utilization and the process's
resident memory (RSS) otherwise, every N steps, into TensorBoard: the
`nvidia-smi` / `top` view of a run, kept beside its loss curves.

The one step timer of tfaccel and its benchmarks is here too: `StepClock`
(warm-up steps kept apart, N timed steps, an optional deadline after which
the step in flight is the last), its `StepTimes` (each step's seconds; median,
percentiles, examples or tokens per second), and the ways to run it:
`time_steps` around any function, `StepTimer` inside `fit`, `time_fit` for a
few real training steps. `time_training` is `time_fit` as a dict; the
automatic choices of precision, XLA and batch size are built on them.

Example:

    from tfaccel import monitor

    model.fit(train_ds, epochs=5,
              callbacks=[monitor.HardwareMonitor("runs/a/logs/train", every_n_steps=20)])
    times = monitor.time_fit(model, train_ds, steps=10, warmup=3)
    print(times.median, times.percentile(90), times.rate(64))   # s, s, examples/s
"""

import dataclasses
import statistics
import time

import numpy as np
import psutil
import tensorflow as tf
from absl import logging

from tfaccel import _compat, plots, summaries
from tfaccel.errors import ConfigError, first_line
from tfaccel.io import write_bytes
from tfaccel.keras import keras

_MB = 1024 * 1024


class CpuSampler:
    """CPU utilization (percent of one core, summed over cores, since the last
    sample) and resident memory of this process."""

    kind = "cpu"

    def __init__(self):
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only starts the interval

    def sample(self):
        return {"cpu_utilization": float(self._process.cpu_percent(None)),
                "rss_mb": self._process.memory_info().rss / _MB}


class NvmlSampler:
    """Utilization (percent) and used memory (MB) of every GPU NVML sees.

    Args:
      nvml: the `pynvml` module (nvidia-ml-py); injectable for tests.

    Raises:
      nvml.NVMLError: when NVML cannot start (no driver).
    """

    kind = "gpu"

    def __init__(self, nvml=None):
        if nvml is None:
            import pynvml as nvml  # deferred: NVML (nvidia-ml-py), the gpu extra
        self._nvml = nvml
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def sample(self):
        values = {}
        for i, handle in enumerate(self._handles):
            utilization = self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu
            values[f"gpu{i}_utilization"] = float(utilization)
            values[f"gpu{i}_memory_mb"] = self._nvml.nvmlDeviceGetMemoryInfo(handle).used / _MB
        return values

    def close(self):
        self._nvml.nvmlShutdown()


def default_sampler(gpus=None):
    """`NvmlSampler` when TensorFlow sees GPUs and NVML starts, else `CpuSampler`.

    Args:
      gpus: the visible GPUs (default: `tf.config.list_physical_devices('GPU')`).
    """
    gpus = tf.config.list_physical_devices("GPU") if gpus is None else gpus
    if gpus:
        try:
            return NvmlSampler()
        except Exception as e:  # noqa: BLE001 (ImportError, or NVMLError without a driver)
            logging.warning("%d GPU(s) visible but NVML is unavailable (%s): monitoring the "
                            "CPU instead; install nvidia-ml-py for GPU utilization",
                            len(gpus), first_line(e, with_type=True))
    return CpuSampler()


class HardwareMonitor(summaries.ScalarLogger):
    """Logs hardware load every `every_n_steps` training steps to TensorBoard.

    Scalars are named `monitor/<name>` (e.g. `monitor/gpu0_utilization`,
    `monitor/cpu_utilization`, `monitor/rss_mb`) at the global step; the last
    sample is also in `self.history`.

    Example:

        model.fit(ds, callbacks=[HardwareMonitor("runs/a/logs/train", every_n_steps=50)])

    Args:
      logdir: TensorBoard log directory.
      every_n_steps: sampling period in training steps (>= 1).
      sampler: an object with `sample() -> {name: value}`; default `default_sampler()`.

    Raises:
      ConfigError: `every_n_steps` < 1.
    """

    def __init__(self, logdir, every_n_steps=50, sampler=None):
        if int(every_n_steps) < 1:
            raise ConfigError(f"every_n_steps={every_n_steps}: the monitor needs a period of at "
                              "least 1 step")
        super().__init__(logdir)
        self.every_n_steps = int(every_n_steps)
        self.sampler = sampler
        self._owns_sampler = sampler is None
        _compat.takes_logs_as_tensors(self)  # it never reads logs: Keras need not wait per step
        self.history = []
        self._step = 0

    def on_train_begin(self, logs=None):
        if self.sampler is None:
            self.sampler = default_sampler()

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        if self._step % self.every_n_steps:
            return
        values = self.sampler.sample()
        self.history.append({"step": self._step, **values})
        # Flushed at epoch ends, not per sample, to keep file writes out of the step loop.
        self.write({f"monitor/{name}": v for name, v in values.items()}, self._step, flush=False)

    def on_epoch_end(self, epoch, logs=None):
        self.flush()

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self._owns_sampler and self.sampler is not None:
            if hasattr(self.sampler, "close"):
                self.sampler.close()
            self.sampler = None


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """The seconds of each timed step, the warm-up steps' apart, and what follows from them.

    Example:

        times = StepTimes(seconds=(0.10, 0.12, 0.11), warmup_seconds=(2.5,))
        times.median, times.percentile(90), times.rate(64)   # 0.11, 0.118, 581.8 examples/s
    """

    seconds: tuple = ()
    """Each timed step, in order."""
    warmup_seconds: tuple = ()
    """Each warm-up step (tracing, compiling, autotuning), in order: in no statistic."""

    @classmethod
    def split(cls, seconds, warmup):
        """The `StepTimes` of steps whose first `warmup` were warm-up."""
        return cls(tuple(seconds[warmup:]), tuple(seconds[:warmup]))

    @property
    def median(self):
        """The median timed step: one stray recompilation or hiccup does not move it."""
        return statistics.median(self.seconds)

    @property
    def mean(self):
        return statistics.fmean(self.seconds)

    def percentile(self, q):
        """The `q`-th percentile (0-100) of the timed steps, interpolated as NumPy's default."""
        return float(np.percentile(self.seconds, q))

    @property
    def total(self):
        """Wall seconds of every step, warm-up included."""
        return sum(self.warmup_seconds) + sum(self.seconds)

    def rate(self, items_per_step):
        """Examples (or tokens, ...) per second at the median step, `items_per_step` a step."""
        return items_per_step / self.median

    def summary(self, batch_size):
        """{'seconds_per_step' (the median), 'steps_per_sec', 'examples_per_sec'}."""
        seconds = self.median
        return {"seconds_per_step": seconds, "steps_per_sec": 1.0 / seconds,
                "examples_per_sec": self.rate(batch_size)}


class StepClock:
    """Times steps on one clock: `warmup` untimed steps first, then up to `steps` timed ones.

    `start()` marks the beginning of a step and `stop()` its end; `lap()` ends
    one step and begins the next at the same instant (steps back to back).
    `done` turns true after the last timed step, or after the step during
    which `deadline` (a `clock()` value) passed: a step is never cut short.
    `times()` gives what was measured as `StepTimes`. `StepTimer` runs one in
    `fit`; `time_steps` around any function.

    Example:

        clock = StepClock(steps=100, warmup=5)
        while not clock.done:
            clock.start()
            run_one_batch()
            clock.stop()
        clock.times().percentile(90)

    Args:
      steps: timed steps to stop after (>= 0; None: no limit).
      warmup: untimed steps first (>= 0).
      deadline: a `clock()` value after which the step in flight is the last, or None.
      clock: the clock, in seconds (injectable for tests).

    Raises:
      ConfigError: a negative `steps` or `warmup`.
    """

    def __init__(self, steps=None, warmup=0, deadline=None, clock=time.perf_counter):
        if warmup < 0 or (steps is not None and steps < 0):
            raise ConfigError(f"steps={steps}, warmup={warmup}: a step count cannot be negative")
        self._steps, self._warmup = steps, int(warmup)
        self._deadline, self._clock = deadline, clock
        self._seconds, self._began, self._late = [], None, False

    @property
    def running(self):
        """Whether a step has begun and not ended."""
        return self._began is not None

    @property
    def done(self):
        timed = len(self._seconds) - self._warmup
        return self._late or (self._steps is not None and timed >= self._steps)

    @property
    def step_seconds(self):
        """Every step measured, warm-up included, in order."""
        return list(self._seconds)

    def start(self):
        self._began = self._clock()

    def stop(self):
        """Ends the step begun at `start()`; returns `done`."""
        self._end(self._clock())
        self._began = None
        return self.done

    def lap(self):
        """Ends the step in flight and begins the next; returns `done`."""
        now = self._clock()
        self._end(now)
        self._began = now
        return self.done

    def cancel(self):
        """Forgets the step in flight (it never ended, e.g. `fit` returned first)."""
        self._began = None

    def _end(self, now):
        self._seconds.append(now - self._began)
        self._late = self._deadline is not None and now >= self._deadline

    def times(self):
        return StepTimes.split(self._seconds, self._warmup)


def time_steps(run_step, steps, warmup=0, deadline=None, clock=time.perf_counter):
    """Calls `run_step()` `warmup` times untimed, then up to `steps` times timed; their times.

    Each call is one step, timed on its own (what runs between calls does not
    count). With `deadline` the call during which `clock()` passed it is the last.

    Example:

        times = time_steps(lambda: interpreter.invoke(), steps=200, warmup=20)
        times.median, times.percentile(90)

    Returns:
      `StepTimes`.
    """
    timer = StepClock(steps, warmup, deadline, clock)
    while not timer.done:
        timer.start()
        run_step()
        timer.stop()
    return timer.times()


class StepTimer(keras.callbacks.Callback):
    """Times `fit`'s steps (from one batch end to the next) with a `StepClock`.

    A callback that reads batch-end logs makes Keras wait for each step's
    results, so the times are real step times, not dispatch times. When the
    clock is done (its timed steps run, or its deadline passed) it ends `fit`
    after that step. With no arguments it times every step, and never stops `fit`.

    Args:
      steps, warmup, deadline, clock: as `StepClock`.
    """

    def __init__(self, steps=None, warmup=0, deadline=None, clock=time.perf_counter):
        super().__init__()
        self.clock = StepClock(steps, warmup, deadline, clock)

    @property
    def step_seconds(self):
        """Every step's seconds, warm-up included."""
        return self.clock.step_seconds

    def times(self):
        return self.clock.times()

    def on_train_batch_begin(self, batch, logs=None):
        if not self.clock.running:
            self.clock.start()

    def on_train_batch_end(self, batch, logs=None):
        if self.clock.lap():
            self.model.stop_training = True  # read by fit after each step

    def on_train_end(self, logs=None):
        self.clock.cancel()  # the lap begun at the last batch end: no step follows in this fit


def time_fit(model, dataset, steps, warmup=0, deadline=None, clock=time.perf_counter):
    """Trains a compiled `model` for `warmup` + `steps` steps of `dataset.repeat()`; their times.

    One `fit` call; the warm-up steps (tracing, XLA compilation, autotuning) are
    kept apart from the timed ones. With `deadline` (a `clock()` value) training
    ends after the step during which it passed (at least one step always runs).
    It changes the model's weights: pass a copy.

    Example:

        times = time_fit(model, train_ds, steps=10, warmup=3)
        times.median, times.rate(64)   # seconds per step, examples/s at batch 64

    Args:
      model: a compiled Keras model.
      dataset: a batched dataset of `(x, y)`.
      steps: timed steps (>= 1).
      warmup: untimed steps first (>= 0).
      deadline, clock: see above.

    Returns:
      `StepTimes`: between 1 and `warmup` + `steps` steps, fewer when the deadline passed.

    Raises:
      ConfigError: `steps` < 1 or `warmup` < 0.
    """
    if steps < 1:
        raise ConfigError(f"steps={steps} must be at least 1")
    timer = StepTimer(steps, warmup, deadline, clock)
    model.fit(dataset.repeat(), steps_per_epoch=warmup + steps, epochs=1, verbose=0,
              shuffle=False, callbacks=[timer])  # a dataset: Keras 3 warns at shuffle=True
    return timer.times()


def time_training(model, dataset, batch_size, warmup=3, steps=10):
    """Median seconds per training step of a compiled `model` on `dataset`, after warm-up.

    `time_fit` with its result as a dict: trains `model` (it changes its
    weights: pass a copy) for `warmup + steps` steps on `dataset.repeat()` in
    one `fit` call. Warm-up steps (tracing, XLA compilation, autotuning) are
    not counted; the median ignores a stray recompilation.

    Args:
      model: a compiled tf_keras model.
      dataset: a batched dataset of `(x, y)`.
      batch_size: global examples per step, for examples/s.
      warmup: steps run first and not timed (>= 1).
      steps: timed steps (>= 1).

    Returns:
      {'seconds_per_step', 'steps_per_sec', 'examples_per_sec'}.
    """
    if warmup < 1 or steps < 1:
        raise ConfigError(f"warmup={warmup} and steps={steps} must both be at least 1")
    return time_fit(model, dataset, steps, warmup).summary(batch_size)


def write_trial_report(logdir, tag, rows, label_keys, value_key, path=None, title=None):
    """Writes a table of trials to TensorBoard (text) and a bar chart (image and PNG file).

    The text is under `tag`, the chart (`plots.plot_trials`) under `tag`_plot;
    with no trial that measured `value_key` there is no chart.

    Args:
      logdir: TensorBoard log directory.
      tag: summary tag, e.g. 'performance/auto_precision'.
      rows: list of dicts, one per trial.
      label_keys: keys whose values name a bar.
      value_key: key of the bar height (rows without it, e.g. failed trials, are left out).
      path: where to save the PNG as well (optional).
      title: chart title (default: `tag`).

    Returns:
      The markdown table.
    """
    table = summaries.markdown_table(rows)
    summaries.write_text(logdir, tag, table)
    png = plots.plot_trials(rows, label_keys, value_key, title=title or tag)
    if png is None:
        return table
    summaries.write_png(logdir, f"{tag}_plot", png)
    if path:
        write_bytes(path, png)
    return table
