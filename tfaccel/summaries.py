"""TensorBoard as the place to inspect every run: write and read back summaries.

Writers for what Keras's TensorBoard callback does not log (the run's config as text,
reports, plots drawn by `tfaccel.plots`, throughput, the learning rate every N steps) and
readers built on TensorBoard's own event-file loader, so that tests and users can check
what a run wrote. Event files are opened here only: `ScalarFile` for scalars written while
training (no TensorFlow op per value), `_writer` for the rest. Every callback that logs
scalars (here, `monitor`, `performance.memory`, `compress.sparsity`) is a `ScalarLogger`, which
owns the file. `tensorboard_command`: what recipes print to see a run (localhost only).

Example:

    summaries.write_text("runs/a/logs/train", "config/flags", "| flag | value |\\n|---|---|")
    summaries.read_text_summaries("runs/a/logs/train")["config/flags"]
"""

import os
import shlex
import time
import warnings

import numpy as np
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from tfaccel import _compat
from tfaccel.keras import flavour_of, keras


class ScalarFile:
    """Scalars from Python through TensorBoard's event-file writer: no TensorFlow op per value.

    (A `tf.summary.scalar` runs several ops, about 1 ms on 2 cores: a tenth of a short epoch
    for an epoch's dozen scalars.) The file opens at the first `write`.
    """

    def __init__(self, logdir):
        self.logdir = str(logdir)
        self._file = None

    def write(self, values, step, flush=True):
        """Writes each `{tag: value}` at `step`; flushed (readable now) unless `flush=False`."""

        if not values:
            return
        if self._file is None:
            self._file = EventFileWriter(self.logdir)
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
            tag=tag, simple_value=float(value)) for tag, value in values.items()])
        self._file.add_event(event_pb2.Event(wall_time=time.time(), step=int(step),
                                             summary=summary))
        if flush:
            self._file.flush()

    def flush(self):
        self._file is not None and self._file.flush()

    def close(self):
        if self._file is not None:
            self._file, file = None, self._file
            file.close()


_TENSORBOARDS = {}


def _tensorboard_class(flavour):
    """Keras's TensorBoard of `flavour`, its scalars written by `ScalarFile`, no learning rate."""
    if flavour in _TENSORBOARDS:
        return _TENSORBOARDS[flavour]

    class KerasTensorBoard(_compat.tensorboard_without_learning_rate(flavour)):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._scalars = {name: ScalarFile(os.path.join(self.log_dir, name))
                             for name in ("train", "validation")}

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            for name, keep in (("train", lambda k: not k.startswith("val_")),
                               ("validation", lambda k: k.startswith("val_"))):
                self._scalars[name].write({f"epoch_{k.removeprefix('val_')}": v
                                           for k, v in logs.items() if keep(k)}, epoch)
            super().on_epoch_end(epoch, {})  # histograms and embeddings, as Keras writes them

        def on_train_batch_end(self, batch, logs=None):
            # Keras writes batch_<metric> at each call even for update_freq='epoch' (0.4 ms each).
            super().on_train_batch_end(batch, None if self.update_freq == "epoch" else logs)

        def on_test_end(self, logs=None):
            optimizer = getattr(self.model, "optimizer", None)
            if logs and optimizer is not None and hasattr(optimizer, "iterations"):
                self._scalars["validation"].write(
                    {f"evaluation_{k}_vs_iterations": v for k, v in logs.items()},
                    int(optimizer.iterations.numpy()), flush=False)
            super().on_test_end({})

        def on_train_end(self, logs=None):
            super().on_train_end(logs)
            for scalar_file in self._scalars.values():
                scalar_file.close()

    _TENSORBOARDS[flavour] = KerasTensorBoard
    return KerasTensorBoard


class TensorBoard(keras.callbacks.Callback):
    """Keras's TensorBoard callback, its scalars written by `ScalarFile`, without a learning rate.

    The scalars (`epoch_<metric>` in `train/` and `validation/`,
    `evaluation_<metric>_vs_iterations`) keep Keras's tags and steps. Keras's
    `epoch_learning_rate` is left out: the rate the *next* update would use,
    one step off `LearningRateLogger`'s `learning_rate`. Everything else
    (graphs, histograms, profiles) is Keras's: the TensorBoard callback of the
    model's own Keras (tf_keras or Keras 3), made when `fit` gives the model.

    Example: `model.fit(ds, callbacks=[summaries.LearningRateLogger("runs/a/logs/train"),
    summaries.TensorBoard("runs/a/logs")])`.
    """

    def __init__(self, log_dir="logs", **kwargs):
        super().__init__()
        self.log_dir, self._kwargs = os.fspath(log_dir), kwargs
        self._keras_callback = self._flavour = None
        _compat.takes_logs_as_tensors(self)  # as Keras's TensorBoard does

    def set_model(self, model):
        super().set_model(model)
        flavour = flavour_of(model)
        if self._keras_callback is None or self._flavour != flavour:
            self._keras_callback = _tensorboard_class(flavour)(self.log_dir, **self._kwargs)
            self._flavour = flavour
            if getattr(self, "params", None):
                self._keras_callback.set_params(self.params)
        self._keras_callback.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        if self._keras_callback is not None:
            self._keras_callback.set_params(params)


def _forward(hook):
    def forwarded(self, *args, **kwargs):
        return getattr(self._keras_callback, hook)(*args, **kwargs)
    forwarded.__name__ = hook
    return forwarded


_FORWARDED = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
              "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end",
              "on_test_batch_begin", "on_test_batch_end", "on_predict_begin", "on_predict_end",
              "on_predict_batch_begin", "on_predict_batch_end")
for _hook in _FORWARDED:
    setattr(TensorBoard, _hook, _forward(_hook))


def _writer(logdir):
    """The one way tfaccel opens a TensorFlow event-file writer (text, images, one-off scalars)."""
    return tf.summary.create_file_writer(str(logdir))


def write_text(logdir, tag, markdown, step=0):
    """Writes a markdown text summary (TensorBoard's Text tab)."""
    writer = _writer(logdir)
    with writer.as_default():
        tf.summary.text(tag, markdown, step=step)
    writer.close()


def write_scalars(logdir, values, step=0):
    """Writes a dict of scalars at `step`."""
    scalars = ScalarFile(logdir)
    scalars.write(values, step)
    scalars.close()


def write_png(logdir, tag, png, step=0):
    """Writes a PNG (bytes or a file path) as an image summary (TensorBoard's Images tab)."""
    if isinstance(png, (str, bytes)) and not (isinstance(png, bytes) and png[:4] == b"\x89PNG"):
        with open(png, "rb") as f:
            png = f.read()
    image = tf.image.decode_png(png, channels=4)[tf.newaxis]
    writer = _writer(logdir)
    with writer.as_default():
        tf.summary.image(tag, image, step=step)
    writer.close()


def markdown_table(rows, columns=None):
    """A markdown table from a list of dicts (or a dict, as two columns)."""
    if isinstance(rows, dict):
        rows = [{"name": k, "value": v} for k, v in rows.items()]
        columns = columns or ["name", "value"]
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))

    def cell(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _load_events(logdir):
    acc = event_accumulator.EventAccumulator(
        str(logdir), size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 0,
                                    event_accumulator.IMAGES: 0})
    return acc.Reload()  # returns the accumulator


def read_scalars(logdir):
    """{tag: [(step, value), ...]} of every scalar in `logdir`'s event files."""
    acc = _load_events(logdir)
    out = {}
    for tag in acc.Tags().get("tensors", []):
        arrays = [(e.step, tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
        values = [(step, float(a)) for step, a in arrays if a.ndim == 0 and a.dtype.kind in "fiu"]
        if values:
            out[tag] = values
    for tag in acc.Tags().get("scalars", []):
        out[tag] = [(e.step, e.value) for e in acc.Scalars(tag)]
    return out


def read_text_summaries(logdir):
    """{tag: text} of the latest text summary of each tag in `logdir`."""
    acc = _load_events(logdir)
    out = {}
    for tag in acc.Tags().get("tensors", []):
        meta = acc.summary_metadata.get(tag)
        if meta is None or meta.plugin_data.plugin_name != "text":
            continue
        arr = tf.make_ndarray(acc.Tensors(tag)[-1].tensor_proto)
        if arr.dtype.kind in "OSU":
            flat = np.asarray(arr).reshape(-1)
            out[tag] = "\n".join(x.decode() if isinstance(x, bytes) else str(x) for x in flat)
    return out


def read_text(logdir):
    """Deprecated (kept for one release): `read_text_summaries`, which it calls."""
    warnings.warn("read_text is deprecated: use tfaccel.read_text_summaries(logdir) for the "
                  "TensorBoard text summaries it read (a language model's corpus is "
                  "tfaccel.read_corpus)", DeprecationWarning, stacklevel=2)
    return read_text_summaries(logdir)


def read_image_tags(logdir):
    """Tags of the image summaries in `logdir` (written by `write_png` or Keras)."""
    acc = _load_events(logdir)
    tags = set(acc.Tags().get("images", []))
    for tag in acc.Tags().get("tensors", []):
        meta = acc.summary_metadata.get(tag)
        if meta is not None and meta.plugin_data.plugin_name == "images":
            tags.add(tag)
    return sorted(tags)


class ScalarLogger(keras.callbacks.Callback):
    """Base of every tfaccel callback that writes scalars to TensorBoard.

    It owns the writer's lifecycle, so that each logger only decides what to
    measure and when: the writer opens on the first `write`, each `write`
    flushes (the curve is readable while training runs), and `on_train_end`
    closes it. Subclasses that override `on_train_end` call `super()`.

    Example:

        class LossLogger(summaries.ScalarLogger):
            def on_epoch_end(self, epoch, logs=None):
                self.write({"my/loss": logs["loss"]}, step=epoch)

    Args:
      logdir: TensorBoard log directory.
    """

    def __init__(self, logdir):
        super().__init__()
        self.logdir = str(logdir)
        self._writer = ScalarFile(self.logdir)  # its file opens at the first write

    def write(self, values, step, flush=True):
        """Writes each `{tag: value}` as a scalar at `step`, then flushes unless `flush=False`."""
        self._writer.write(values, step, flush)

    def flush(self):
        """Flushes what `write(..., flush=False)` buffered."""
        self._writer.flush()

    def on_train_end(self, logs=None):
        self._writer.close()


class EpochScalarLogger(ScalarLogger):
    """Base of callbacks that measure a few values per epoch and log them.

    Subclasses implement `epoch_values(epoch)` -> {name: float}; each epoch's
    values are kept in `history`, added to Keras's `logs`, and written to
    TensorBoard as ``f"{tag_prefix}{name}"`` at step `epoch`.
    """

    tag_prefix = ""

    def __init__(self, logdir):
        super().__init__(logdir)
        self.history = []

    def epoch_values(self, epoch):
        raise NotImplementedError

    def on_epoch_end(self, epoch, logs=None):
        values = self.epoch_values(epoch)
        self.history.append(values)
        if logs is not None:
            logs.update(values)
        self.write({f"{self.tag_prefix}{name}": v for name, v in values.items()}, step=epoch)


class ThroughputLogger(EpochScalarLogger):
    """Logs examples/sec and steps/sec of each epoch to TensorBoard and to `logs`, and with
    `flops_per_example` and `peak_flops` the model FLOP utilization (`mfu`: achieved model
    FLOP/s over the peak, see `tfaccel.performance.utilization`).

    Steps are the optimizer's updates (read at the epoch's begin and end: no per-step work);
    the time includes validation. The first epoch includes tracing.
    """

    tag_prefix = "epoch_"

    def __init__(self, logdir, global_batch_size, flops_per_example=None, peak_flops=None):
        super().__init__(logdir)
        self.global_batch_size = int(global_batch_size)
        self.flops_per_example = flops_per_example
        self.peak_flops = peak_flops

    def on_epoch_begin(self, epoch, logs=None):
        self._start_step = int(self.model.optimizer.iterations.numpy())
        self._start = time.perf_counter()

    def epoch_values(self, epoch):
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        steps = int(self.model.optimizer.iterations.numpy()) - self._start_step
        values = {"examples_per_sec": steps * self.global_batch_size / elapsed,
                  "steps_per_sec": steps / elapsed}
        if self.flops_per_example:
            flops = values["examples_per_sec"] * self.flops_per_example
            values["model_tflops_per_sec"] = flops / 1e12
            if self.peak_flops:
                values["mfu"] = flops / self.peak_flops
        return values


def current_learning_rate(optimizer):
    """The optimizer's learning rate now, resolving a schedule at its current step."""
    inner = getattr(optimizer, "inner_optimizer", None)  # LossScaleOptimizer
    return _compat.last_learning_rate(optimizer if inner is None else inner)


class LearningRateLogger(ScalarLogger):
    """Logs the learning rate as `learning_rate` every `every_n_steps` steps and at each epoch end.

    The step of each value is the optimizer's step count (`optimizer.iterations`)
    after the update, and the value is the rate that update used: at step s,
    `schedule(s - 1)`. This is the run's one learning-rate curve: pair it with
    `summaries.TensorBoard`, which leaves out Keras's own per-epoch copy. Per
    step it only adds to the step count read at the epoch's begin; the rate
    is read every `every_n_steps` steps, and flushed once per epoch.
    """

    def __init__(self, logdir, every_n_steps=10):
        super().__init__(logdir)
        self.every_n_steps = max(1, int(every_n_steps))
        _compat.takes_logs_as_tensors(self)  # it never reads the logs
        self._last_step = self._first_batch = None
        self._epoch_start, self._steps_per_call = 0, 1

    def _log(self, step):
        if step == self._last_step:  # an epoch that ends on a multiple of every_n_steps
            return
        self.write({"learning_rate": current_learning_rate(self.model.optimizer)}, step, False)
        self._last_step = step

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = int(self.model.optimizer.iterations.numpy())
        self._steps_per_call = _compat.steps_per_execution(self.model)
        self._first_batch = None  # a resumed epoch starts past batch 0

    def on_train_batch_end(self, batch, logs=None):
        if self._first_batch is None:  # Keras passes the last step of each call
            self._first_batch = batch - self._steps_per_call + 1
        step = self._epoch_start + batch - self._first_batch + 1
        if step % self.every_n_steps == 0:
            self._log(step)

    def on_epoch_end(self, epoch, logs=None):
        self._log(int(self.model.optimizer.iterations.numpy()))
        self.flush()


def tensorboard_command(logdir):
    """The shell command that shows `logdir` in TensorBoard, served to this machine only.

    TensorBoard listens on localhost; from another machine, tunnel to it rather
    than serving it to the network: ``ssh -L 6006:localhost:6006 user@host``,
    then open http://localhost:6006.
    """
    return f"tensorboard --logdir {shlex.quote(str(logdir))} --host localhost"
