"""A TensorFlow profiler trace of chosen training steps, kept under a run's logs, and its op times.

`ProfileSteps(logdir, start, stop)` is a Keras callback that traces training steps
`start`..`stop` (1-based, counted over the whole `fit`, as Keras's TensorBoard callback
counts `profile_batch`) into `logdir`/plugins/profile/<time>/ (TensorBoard's Profile tab
reads it), then prints what the steps spent their time on: `op_times` reads the trace back
and adds up each kind of TensorFlow op on the host's compute threads (matrix products,
element-wise ops, variable updates, ...), per step. That table is where a step's time goes
that is not math: many small element-wise ops and variable updates are executor overhead
on a CPU, a few large matrix products are the model's FLOPs.

Example:

    from tfaccel.performance import step_profile

    model.fit(ds, epochs=1, steps_per_epoch=50,
              callbacks=[step_profile.ProfileSteps("runs/a/logs/train", 20, 24)])
    for row in step_profile.op_times(step_profile.last_trace("runs/a/logs/train"), steps=5):
        print(row)   # {'op': '_MklMatMul', 'ms_per_step': ..., 'ops_per_step': ..., 'share': ...}
"""

import collections
import glob
import os

import tensorflow as tf

from tfaccel.errors import ConfigError
from tfaccel.keras import keras

_WRAPPERS = ("Process", "ExecutorDoneCallback", "Start")  # executor events enclosing the ops


def check_profile_steps(start, stop):
    """(start, stop) when 1 <= start <= stop; ConfigError naming the fix otherwise."""
    if not (isinstance(start, int) and isinstance(stop, int)) or not 1 <= start <= stop:
        raise ConfigError(f"profile steps {start},{stop}: give two step numbers start,stop with "
                          "1 <= start <= stop, e.g. 20,24 (after the first steps' tracing)")
    return start, stop


class ProfileSteps(keras.callbacks.Callback):
    """Traces training steps `start`..`stop` of `fit` into `logdir` and prints their op times.

    The trace's folder is `logdir`/plugins/profile/<time>/ (`last_trace(logdir)`), so
    `tensorboard --logdir <logdir's parent>` shows it in its Profile tab. After `stop`,
    `printer` gets the op-time table (`op_times`), and `table` keeps it. If `fit` ends
    before `stop`, the trace ends with it.
    """

    def __init__(self, logdir, start, stop, printer=print, top=12):
        super().__init__()
        self.logdir, (self.start, self.stop) = os.fspath(logdir), check_profile_steps(start, stop)
        self.printer, self.top, self.table, self._step, self._tracing = printer, top, None, 0, False

    def on_train_batch_begin(self, batch, logs=None):
        self._step += 1
        if self._step == self.start:
            tf.profiler.experimental.start(self.logdir)
            self._tracing = True

    def on_train_batch_end(self, batch, logs=None):
        if self._tracing and self._step >= self.stop:
            self._finish()

    def on_train_end(self, logs=None):
        if self._tracing:
            self._finish()

    def _finish(self):
        tf.profiler.experimental.stop()
        self._tracing = False
        steps = self._step - self.start + 1
        path = last_trace(self.logdir)
        self.table = op_times(path, steps)
        if self.printer is not None:
            lines = [f"{r['ms_per_step']:9.2f} ms/step {r['share']:6.1%} {r['ops_per_step']:7.1f}"
                     f" ops/step  {r['op']}" for r in self.table[:self.top]]
            self.printer(f"profile of steps {self.start}-{self._step} ({path}): time in each "
                         "kind of op, over the compute threads\n" + "\n".join(lines))


def last_trace(logdir):
    """The newest .xplane.pb under `logdir`/plugins/profile/, or None."""
    paths = sorted(glob.glob(os.path.join(os.fspath(logdir), "plugins", "profile", "*",
                                          "*.xplane.pb")))
    return paths[-1] if paths else None


def op_times(path, steps=1):
    """[{op, ms_per_step, ops_per_step, share}] of a trace's TensorFlow ops, slowest first.

    Sums the durations of each op type (e.g. `_MklMatMul`, `Mul`, `AssignSubVariableOp`)
    on the host CPU's compute threads of the .xplane.pb at `path`, divided by `steps`;
    `share` is of all ops' time (the threads' sum, so it can exceed the wall time).
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # deferred: protobuf parse

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    total, count = collections.Counter(), collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                op = plane.event_metadata[event.metadata_id].name.rpartition(":")[2].strip()
                if op and op not in _WRAPPERS:
                    total[op] += event.duration_ps
                    count[op] += 1
    everything = sum(total.values()) or 1
    return [{"op": op, "ms_per_step": ps / 1e9 / steps, "ops_per_step": count[op] / steps,
             "share": ps / everything} for op, ps in total.most_common()]
