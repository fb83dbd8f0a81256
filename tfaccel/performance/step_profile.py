"""A TensorFlow profiler trace of chosen training steps, kept under a run's logs: its op times
and what the allocator held at its peak.

`ProfileSteps(logdir, start, stop)` is a Keras callback that traces training steps
`start`..`stop` (1-based, counted over the whole `fit`, as Keras's TensorBoard callback
counts `profile_batch`) into `logdir`/plugins/profile/<time>/ (TensorBoard's Profile tab
reads it), then prints what the steps spent their time on: `op_times` reads the trace back
and adds up each kind of TensorFlow op on the host's compute threads (matrix products,
element-wise ops, variable updates, ...), per step. That table is where a step's time goes
that is not math: many small element-wise ops and variable updates are executor overhead
on a CPU, a few large matrix products are the model's FLOPs.

`allocator_peak` reads the same trace's allocations (TensorFlow's BFC allocator records
each one while the profiler runs: a GPU's memory, and the host's under
`memory.use_pooled_host_allocator`) and returns the buffers alive at the allocator's
peak, each with the op that made it, its shape, the bytes it asked for and the bytes of
the chunk it holds. The difference is the allocator's slack: a request is served whole
from any free chunk less than twice its size, so the same step's peak moves from process
to process. The zoo CNN's step at batch 256 (SGD, float32), traced in ten processes,
peaked at 16.9-20.1 MB: its buffers asked for 14.3-16.5 MB and were held in chunks
1.2-4.8 MB (7-31%) larger (its [256, 8, 8, 64] ReLU output of 4.2 MB took a chunk of
4.2-7.5 MB); the graph of the step sees the first number, only a run the second
(`calibrate` reports both).

Example:

    from tfaccel.performance import step_profile

    model.fit(ds, epochs=1, steps_per_epoch=50,
              callbacks=[step_profile.ProfileSteps("runs/a/logs/train", 20, 24)])
    for row in step_profile.op_times(step_profile.last_trace("runs/a/logs/train"), steps=5):
        print(row)   # {'op': '_MklMatMul', 'ms_per_step': ..., 'ops_per_step': ..., 'share': ...}
    peak = step_profile.allocator_peak(step_profile.last_trace("runs/a/logs/train"))
    print(step_profile.format_allocator_peak(peak))
"""

import collections
import dataclasses
import glob
import os
import tempfile

import tensorflow as tf

from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.performance import memory_pool

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
    `printer` gets the op-time table (`op_times`), and `table` keeps it; where the
    allocator records its allocations (the first GPU's, else the host's pooled allocator),
    `printer` also gets the buffers alive at its peak (`allocator_peak`), and `peak` keeps
    them. If
    `fit` ends before `stop`, the trace ends with it.
    """

    def __init__(self, logdir, start, stop, printer=print, top=12):
        super().__init__()
        self.logdir, (self.start, self.stop) = os.fspath(logdir), check_profile_steps(start, stop)
        self.printer, self.top, self.table, self._step, self._tracing = printer, top, None, 0, False
        self.peak = None  # the allocator's peak in the trace (`allocator_peak`), if recorded

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
        self.peak = allocator_peak(path, _device())
        if self.printer is not None:
            lines = [f"{r['ms_per_step']:9.2f} ms/step {r['share']:6.1%} {r['ops_per_step']:7.1f}"
                     f" ops/step  {r['op']}" for r in self.table[:self.top]]
            self.printer(f"profile of steps {self.start}-{self._step} ({path}): time in each "
                         "kind of op, over the compute threads\n" + "\n".join(lines))
            if self.peak is not None:
                self.printer(format_allocator_peak(self.peak, self.top))


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
    space = _space(path)
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


def _space(path):
    """The XSpace (the profiler's trace) in the .xplane.pb at `path`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # deferred: protobuf parse

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    return space


def _device():
    """The device whose allocator a trace is read for: the first GPU, else the CPU."""
    return "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"


def _allocator_of(device):
    """A test of allocator names for `device` ('CPU:0', 'GPU:1', '/device:GPU:1')."""
    kind, _, index = device.rpartition("device:")[2].upper().partition(":")
    if kind == "GPU":
        return lambda name: name == f"GPU_{int(index or 0)}_bfc"
    if kind == "CPU":  # the pooled host allocator; not the GPU's pinned host pool
        return lambda name: "cpu" in name.lower()
    raise ConfigError(f"device {device!r}: give 'CPU:0' or 'GPU:<n>'")


def allocation_events(path, device="CPU:0"):
    """The allocations and frees of `device`'s allocator in the trace at `path`, in time order.

    Each is a dict: ``allocated`` (False for a free), ``address``, ``in_use`` (the
    allocator's bytes in use after it), and for an allocation ``requested`` (bytes asked
    for), ``held`` (the chunk's bytes, what ``in_use`` counts), ``op`` (the TensorFlow op
    that asked), ``shape`` and ``region`` ('output', 'temp': a kernel's own workspace,
    'persist'). Empty when the allocator records nothing: a host without
    the pooled allocator, whose malloc the profiler does not see.
    """
    wanted = _allocator_of(device)
    events = []
    for plane in _space(path).planes:
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        kinds = {k: v.name for k, v in plane.event_metadata.items()
                 if v.name in ("MemoryAllocation", "MemoryDeallocation")}
        if not kinds:
            continue
        for line in plane.lines:
            for event in line.events:
                if event.metadata_id not in kinds:
                    continue
                stats = {}
                for stat in event.stats:
                    which = stat.WhichOneof("value")
                    value = getattr(stat, which)
                    stats[names.get(stat.metadata_id)] = (names.get(value) if which == "ref_value"
                                                          else value)
                if not wanted(str(stats.get("allocator_name", ""))):
                    continue
                events.append({
                    "time_ps": line.timestamp_ns * 1000 + event.offset_ps,
                    "allocated": kinds[event.metadata_id] == "MemoryAllocation",
                    "address": int(stats.get("addr", 0)),
                    "in_use": int(stats.get("bytes_allocated", 0)),
                    "requested": int(stats.get("requested_bytes", 0)),
                    "held": int(stats.get("allocation_bytes", 0)),
                    "op": str(stats.get("tf_op", "") or ""),
                    "shape": str(stats.get("shape", "") or ""),
                    "region": str(stats.get("region_type", "") or "")})
    events.sort(key=lambda e: e["time_ps"])
    return events


@dataclasses.dataclass(frozen=True)
class LiveBuffer:
    """A buffer alive at the allocator's peak: the op that asked for it, its shape, the bytes
    asked for and the bytes of the chunk that holds it."""

    op: str
    shape: str
    requested: int
    held: int


@dataclasses.dataclass(frozen=True)
class AllocatorPeak:
    """The allocator's peak in a trace: `peak` bytes in use, the `buffers` allocated during the
    trace and alive then (largest chunk first), and `before`: bytes still held from before the
    trace began (weights, optimizer slots, an input batch)."""

    peak: int
    buffers: tuple
    before: int

    @property
    def requested(self):
        """Bytes the buffers made during the trace asked for."""
        return sum(b.requested for b in self.buffers)

    @property
    def slack(self):
        """Bytes their chunks hold beyond what they asked for."""
        return sum(b.held - b.requested for b in self.buffers)

    @property
    def slack_share(self):
        """The slack as a share of the bytes asked for at the peak, those held from before
        the trace counted as asked for (`memory_pool.slack_share`, as the calibration and
        `benchmarks/bench_memory.py` report it)."""
        return memory_pool.slack_share(self.peak, self.slack)


def allocator_peak(path, device="CPU:0"):
    """The buffers alive when `device`'s allocator peaked in the trace at `path` (`AllocatorPeak`),
    or None when the trace has no allocations of it (`allocation_events`)."""
    events = allocation_events(path, device)
    if not events:
        return None
    live, best, best_live = {}, None, {}
    for e in events:
        if e["allocated"]:
            live[e["address"]] = e
        else:
            live.pop(e["address"], None)
        if best is None or e["in_use"] > best:
            best, best_live = e["in_use"], dict(live)
    buffers = sorted((LiveBuffer(e["op"], e["shape"], e["requested"], e["held"])
                      for e in best_live.values()), key=lambda b: (-b.held, b.op))
    return AllocatorPeak(best, tuple(buffers), max(0, best - sum(b.held for b in buffers)))


def traced_allocator_peak(run, device=None):
    """Runs `run()` under TensorFlow's profiler and returns its allocator's peak (`AllocatorPeak`).

    Raises:
      ConfigError: the allocator recorded nothing (on a CPU, call
        `memory.use_pooled_host_allocator()` before TensorFlow's first op), or a profiler is
        already running.
    """
    device = device or _device()
    with tempfile.TemporaryDirectory() as logdir:
        try:
            tf.profiler.experimental.start(logdir)
        except tf.errors.AlreadyExistsError:
            raise ConfigError("a profiler is already running: stop it before tracing the "
                              "allocator") from None
        try:
            run()
        finally:
            tf.profiler.experimental.stop()
        peak = allocator_peak(last_trace(logdir), device)
    if peak is None:
        raise ConfigError(f"{device}'s allocator recorded no allocations: on a CPU, call "
                          "tfaccel.performance.memory.use_pooled_host_allocator() before "
                          "TensorFlow's first op")
    return peak


def format_allocator_peak(peak, top=8):
    """Text of an `AllocatorPeak`: the totals, then its `top` largest buffers."""
    mb = 1e6
    lines = [f"allocator peak {peak.peak / mb:,.2f} MB: {peak.before / mb:,.2f} MB held from "
             f"before the trace, {peak.requested / mb:,.2f} MB asked for by {len(peak.buffers)} "
             f"buffers made in it, held in chunks {peak.slack / mb:,.2f} MB larger "
             f"({peak.slack_share:.0%} of all asked for: a chunk under twice a request is "
             "served whole)"]
    lines += [f"{b.held / mb:10.2f} MB held {b.requested / mb:10.2f} MB asked  {b.op} {b.shape}"
              for b in peak.buffers[:top]]
    return "\n".join(lines)
