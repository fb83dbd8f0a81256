"""Watching what training costs: step times, and GPU or CPU load in TensorBoard.

`HardwareMonitor` samples GPU utilization and memory through NVML
(nvidia-ml-py) when GPUs are visible, and CPU utilization and the process's
resident memory (RSS) otherwise, every N steps, into TensorBoard: the
`nvidia-smi` / `top` view of a run, kept beside its loss curves.
`time_training` runs a few real training steps and returns their median step
time; the automatic choices of precision, XLA and batch size are built on it.

Example:

    from tfaccel import monitor

    model.fit(train_ds, epochs=5,
              callbacks=[monitor.HardwareMonitor("runs/a/logs/train", every_n_steps=20)])
    print(monitor.time_training(model, train_ds, batch_size=64))
"""

import statistics
import time

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


class StepTimer(keras.callbacks.Callback):
    """Records the wall time of each training step (between batch ends).

    A callback that reads batch-end logs makes Keras wait for each step's
    results, so the times are real step times, not dispatch times.
    """

    def __init__(self):
        super().__init__()
        self.step_seconds = []
        self._last = None

    def on_train_batch_begin(self, batch, logs=None):
        if self._last is None:
            self._last = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        self.step_seconds.append(now - self._last)
        self._last = now


def time_training(model, dataset, batch_size, warmup=3, steps=10):
    """Median seconds per training step of a compiled `model` on `dataset`, after warm-up.

    Trains `model` (it changes its weights: pass a copy) for `warmup + steps`
    steps on `dataset.repeat()` in one `fit` call. Warm-up steps (tracing,
    XLA compilation, autotuning) are not counted; the median ignores a
    stray recompilation.

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
    timer = StepTimer()
    model.fit(dataset.repeat(), steps_per_epoch=warmup + steps, epochs=1, verbose=0,
              callbacks=[timer])
    seconds = statistics.median(timer.step_seconds[warmup:])
    return {"seconds_per_step": seconds, "steps_per_sec": 1.0 / seconds,
            "examples_per_sec": batch_size / seconds}


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
