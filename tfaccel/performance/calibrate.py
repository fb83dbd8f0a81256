"""A memory plan checked by running the step: peaks measured at three batches, fit, scaled.

`measure_memory(model, settings)` measures the model the way
`benchmarks/bench_memory.py` measures a training run: each peak comes from a fresh
Python process (an allocator that has served nothing else) with TensorFlow's pooled
host allocator (`memory.use_pooled_host_allocator`) that builds the model, compiles it
with its optimizer and trains it by `model.fit` on one constant batch
(`Dataset.from_tensors(...).repeat()`): 2 warm-up steps, then the allocator's peak over
`steps` steps (`memory.training_peak_bytes`). One process per batch size: a process
that had run a smaller batch first would hand the larger one a fragmented pool. `fit`
is the path a user's run takes, and it holds memory a bare training step does not (the
dataset iterator and its prefetch buffer, the compiled step's temporaries, the loss
and metric bookkeeping: about 0.4 MB, a fifth of a small MLP's peak); a calibration
with a bare `tf.function` step missed exactly that fixed part. The loss is the
planner's (`memory_graph.squared_output_step` sums it): the mean squared output in float32,
which keeps a float32 tensor of the outputs' size as a cross-entropy keeps its gradient
of the logits; a classifier's cross-entropy adds only its softmax (batch x classes).

The batches are an eighth, a quarter and half of the target (micro-)batch. The order
in which TensorFlow runs independent ops differs from step to step and process to
process, and so does the peak (per-step peaks of the zoo CNN at batch 256 ranged
14.4-18.8 MB in one process); the largest over a run's steps is what the benchmark
reports, so each batch runs in `repeats` processes of `steps` steps and its largest
peak counts, the statistic the benchmark takes over its own processes. A
least-squares line through the three peaks, ``fixed + per_example * batch``, predicts
the target batch, unless the graph's plan, given at the same batches (`plan_memory` gives
it), bends above the line beyond them: then the graph's plan at the target, shifted by
the measured peak's distance from it at the largest batch measured, is the prediction
(`predict`).

After its measured steps, each process runs `TRACED_STEPS` more under TensorFlow's profiler
and reads what the allocator held at their peak (`step_profile.allocator_peak`): the bytes
the tensors asked for and the chunks' slack beyond them (a request is served whole from
any free chunk under twice its size). `Calibration.slack` keeps the largest slack per
batch, as a fraction of the bytes asked for: it is how far one process's peak can sit above
another's for the same step (the zoo CNN at batch 256: 7-31% in ten processes), and so the
uncertainty of any single measured peak, this prediction's target included.

Which to trust when: the measured prediction includes what the graph cannot see
(kernels' scratch buffers beyond the convolution gradients' column buffers the graph's plan
counts with oneDNN off, the order TensorFlow runs independent ops in, the allocator's
rounding), so on this machine it is the better number; the graph's
(`tfaccel.performance.memory_graph`) is the one that transfers to another device (it
counts tensors, not one backend's buffers) and costs no run.
Under gradient accumulation each process trains as the run does
(`accumulate.enable_gradient_accumulation`), on whole batches of N micro-batches of the
calibration sizes: the whole batch the dataset yields, its split and the accumulator the
loop carries are measured, not added by rule (a micro-batch alone, plus the accumulator,
missed 27% of the zoo CNN's peak at batch 1,024 in 4 micro-batches).

Example:

    from tfaccel.performance import calibrate, plan

    c = calibrate.measure_memory("cnn", plan.PlanSettings(batch_size=512),
                                 input_shape=(8, 8, 1), num_classes=10)
    print(c.predicted, c.peaks)
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

from tfaccel.errors import ConfigError, ModelError
from tfaccel.performance import memory_pool

CALIBRATION_FRACTIONS = (8, 4, 2)
"""A calibration runs the target (micro-)batch divided by each of these."""
CALIBRATION_REPEATS = 3
"""Fresh processes per calibration; the largest peak of each batch counts."""
TRACED_STEPS = 2
"""Steps each calibration process runs under the profiler after the measured ones, to read
the allocator's slack at their peak (`step_profile.allocator_peak`)."""
_TIMEOUT_S = 900


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Measured peaks ({batch: bytes}), their fit, and its prediction at the target batch."""

    peaks: dict
    per_example: float
    fixed: int
    batch_size: int
    predicted: int
    spread: float = 0.0  # the largest (largest peak / smallest peak - 1) over the batches
    line: int = 0  # the fit's prediction at the target batch
    graph_shifted: int = 0  # the graph's plan at the target, shifted (0: no graph given)
    processes: dict = dataclasses.field(default_factory=dict)  # {batch: [each process's readings]}
    method: str = ("measured (model.fit at 1/8, 1/4 and 1/2 of the batch, one fresh process "
                   "each, largest peak of 3 per batch, fit and scaled)")

    @property
    def slack(self):
        """{batch: the largest allocator slack among its processes' traced peaks, as a share of
        the bytes asked for (`memory_pool.slack_share`)}; batches without a trace are left
        out."""
        shares = {b: [memory_pool.slack_share(r["traced_peak"], r["slack"])
                      for r in readings if "slack" in r]
                  for b, readings in self.processes.items()}
        return {b: max(s) for b, s in shares.items() if s}


def _source(model, tmpdir):
    """What the child process builds: a zoo name or a file as given, a model saved to
    `tmpdir`."""
    if isinstance(model, str):
        return model
    path = os.path.join(tmpdir, "model.keras")
    try:
        model.save(path)
    except Exception as e:  # savers raise many types for a model they cannot write
        raise ModelError(f"cannot save {model.name!r} to measure it in a fresh process "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__}): "
                         "pass a .keras file or a zoo name") from None
    return path


def calibration_batches(micro_batch):
    """The batch sizes a calibration for `micro_batch` runs (at least two distinct)."""
    batches = sorted({max(1, int(micro_batch) // k) for k in CALIBRATION_FRACTIONS})
    return tuple(batches) if len(batches) > 1 else (batches[0], 2 * batches[0])


def fit_line(peaks):
    """(per_example, fixed) of the least-squares line through {batch: peak bytes}; a negative
    slope (the peaks' spread hiding a small per-example cost) counts as none."""
    xs, ys = list(peaks), [peaks[b] for b in peaks]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var)
    return slope, int(round(my - slope * mx if slope else max(ys)))


def predict(peaks, micro_batch, graph=None):
    """(prediction, line, graph_shifted) at `micro_batch` from the measured {batch: peak}.

    The line is the least-squares fit through the peaks (`fit_line`), scaled. A training
    step's peak is the largest of its phases (the backward pass holding the activations,
    the optimizer's update holding its temporaries beside the model states), so it can
    bend upwards beyond the batches measured, where a phase the small batches never reach
    takes over: the zoo MLP at batch 256 peaked 25% above the line through 32, 64 and 128.
    The graph's plan (`graph`: {batch: planned bytes} at the measured batches and the
    target) foresees that bend; shifted by what the measurement sees beyond it at the
    largest batch measured (backend workspaces, the allocator's rounding), it is the
    prediction when it is above the line."""
    per_example, fixed = fit_line(peaks)
    line = int(round(fixed + per_example * micro_batch))
    if not graph:
        return line, line, 0
    largest = max(peaks)
    shifted = int(round(graph[micro_batch] + peaks[largest] - graph[largest]))
    return max(line, shifted), line, shifted


def measure_memory(model, settings, input_shape=None, num_classes=None, sequence_length=None,
                   batches=None, steps=8, repeats=CALIBRATION_REPEATS, graph=None, onednn=None):
    """Measures `model` training under `settings` in fresh processes; returns a `Calibration`.

    Args:
      model: a zoo name (with `input_shape`, `num_classes`), a .keras/.h5 file, or a built
        model (saved to a temporary .keras file for the child).
      settings: a checked `plan.PlanSettings` (batch, precision, optimizer, accumulation).
      sequence_length: the length of a variable-length input.
      batches: the batch sizes measured (default `calibration_batches` of the micro-batch).
      repeats: fresh processes; each batch's largest peak counts.
      graph: the graph's plan ({micro-batch: bytes}) at the target micro-batch and at every
        batch measured, to predict a bend beyond them (`predict`); `plan_memory` gives it.
      onednn: True or False runs the children with oneDNN's kernels on or off
        (``TF_ENABLE_ONEDNN_OPTS``: off, this CPU runs the kernels, and keeps the buffers, of
        a CPU without AVX512_VNNI, AVX512_BF16, AVX-VNNI or AMX); None, as this process.

    Raises:
      ConfigError: bad batches; ModelError: the child failed (its last error line).
    """
    micro = max(1, settings.batch_size // settings.grad_accum_steps)
    batches = tuple(int(b) for b in (batches or calibration_batches(micro)))
    if len(set(batches)) < 2 or min(batches) < 1:
        raise ConfigError(f"batches={batches}: at least two distinct positive batch sizes")
    spec = {"input_shape": input_shape, "num_classes": num_classes,
            "precision": settings.precision, "optimizer": settings.optimizer,
            "sequence_length": sequence_length, "steps": int(steps),
            "grad_accum_steps": settings.grad_accum_steps,
            "onednn": None if onednn is None else bool(onednn)}
    processes = {b: [] for b in sorted(set(batches))}
    if graph and not set(processes) | {micro} <= set(graph):
        raise ConfigError(f"graph={graph}: give the planned bytes at batches "
                          f"{sorted(set(processes) | {micro})}")
    with tempfile.TemporaryDirectory() as tmpdir:
        spec["model"] = _source(model, tmpdir)
        for _ in range(max(1, int(repeats))):
            for b in processes:  # one batch per process: a pool that served only it
                processes[b].append(_run_child(dict(spec, batch=b)))
    runs = {b: [int(r["peak"]) for r in readings] for b, readings in processes.items()}
    peaks = {b: max(p) for b, p in runs.items()}
    spread = max(max(p) / min(p) - 1 for p in runs.values())
    per_example, fixed = fit_line(peaks)
    predicted, line, shifted = predict(peaks, micro, graph)
    accumulated = (f" in batches of {settings.grad_accum_steps} micro-batches"
                   if settings.grad_accum_steps > 1 else "")
    method = (f"measured (model.fit at batches {', '.join(map(str, runs))}{accumulated}, one "
              f"fresh process each, largest peak of {len(next(iter(runs.values())))} per batch "
              f"over {int(steps)} steps, fit and scaled"
              + ("; the graph's plan shifted to the largest batch's peak, which is above the "
                 "line" if shifted > line else "; the line" if graph else "") + ")")
    return Calibration(peaks, per_example, fixed, settings.batch_size, predicted, spread,
                       line, shifted, processes, method)


def _run_child(spec):
    """{'peak': bytes} from one fresh process measuring `spec`."""
    proc = subprocess.run([sys.executable, "-m", "tfaccel.performance.calibrate",
                           json.dumps(spec)], capture_output=True, text=True, check=False,
                          timeout=_TIMEOUT_S, env=_child_env(spec.get("onednn")))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEAKS ")]
    if proc.returncode or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(f"measuring {spec['model']!r} failed: {last}")
    return json.loads(lines[-1][len("PEAKS "):])


def _child_env(onednn):
    """The environment of a measuring child: quiet, and oneDNN as asked (None: as inherited)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    if onednn is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn else "0"
    return env


def _optimizer(name, model):
    """`name` (`plan.SLOTS`) as an optimizer of `model`'s Keras."""
    # deferred: TensorFlow (only the child process trains)
    from tfaccel.keras import keras_of

    optimizers = keras_of(model).optimizers
    if name == "momentum":
        return optimizers.SGD(1e-3, momentum=0.9)
    return {"sgd": optimizers.SGD, "adam": optimizers.Adam, "adamw": optimizers.AdamW,
            "rmsprop": optimizers.RMSprop}[name](1e-3)


def _child(spec):
    """In the fresh process: {'peak': bytes} of `spec`'s model trained by `fit` on
    micro-batches of `spec['batch']` (`spec['grad_accum_steps']` of them a step), measured
    as `benchmarks/bench_memory.py` measures a run."""
    from tfaccel.performance import memory  # deferred: TensorFlow, after the allocator is set

    memory.use_pooled_host_allocator()
    import tensorflow as tf  # deferred: TensorFlow

    from tfaccel.keras import input_specs  # deferred: TensorFlow
    from tfaccel.performance import memory_profile  # deferred: TensorFlow
    from tfaccel.train import precision as precisions  # deferred: TensorFlow

    model = memory_profile.built_model(spec["model"], spec["input_shape"],
                                       spec["num_classes"], spec["precision"])
    memory.weights_into_pool(model)  # a loaded model's weights may sit outside the pool
    opt = precisions.wrap_optimizer(_optimizer(spec["optimizer"], model), spec["precision"])
    # no metrics: a KerasHub task's own ("auto") would compare its outputs with labels it
    # is not given (the planner's loss reads none)
    model.compile(optimizer=opt, loss=_squared_loss, metrics=[], weighted_metrics=[])
    accumulation = int(spec.get("grad_accum_steps", 1))
    if accumulation > 1:
        from tfaccel.performance import accumulate  # deferred: TensorFlow

        accumulate.enable_gradient_accumulation(model, accumulation)
    batch = spec["batch"] * accumulation  # the micro-batch, as many times as the run has them
    data = [tf.ones(s.shape, s.dtype) if s.dtype.is_integer or s.dtype == tf.bool
            else tf.random.normal(s.shape, dtype=s.dtype)
            for s in input_specs(model, batch, spec["sequence_length"])]
    inputs = data[0] if len(data) == 1 else tf.nest.pack_sequence_as(
        getattr(model, "input", None), data)
    if isinstance(inputs, list):  # a dataset would stack a list into one tensor
        inputs = tuple(inputs)
    outputs = len(getattr(model, "outputs", None) or [None])
    labels = tf.zeros((batch,)) if outputs == 1 else tuple(tf.zeros((batch,))
                                                           for _ in range(outputs))
    dataset = tf.data.Dataset.from_tensors((inputs, labels)).repeat()
    del data
    model.fit(dataset, steps_per_epoch=2, epochs=1, verbose=0)
    peak = memory.training_peak_bytes(
        lambda: model.fit(dataset, steps_per_epoch=spec["steps"], epochs=1, verbose=0),
        steps=1, warmup=0)
    from tfaccel.performance import step_profile  # deferred: TensorFlow

    try:  # after the measured steps, so the profiler's work does not touch their peak
        traced = step_profile.traced_allocator_peak(
            lambda: model.fit(dataset, steps_per_epoch=TRACED_STEPS, epochs=1, verbose=0),
            "CPU:0")
    except ConfigError:  # no trace (a profiler already running): the peak stands alone
        return {"peak": peak}
    return {"peak": peak, "traced_peak": traced.peak, "slack": traced.slack}


def _squared_loss(_, outputs):
    """The planner's loss (`memory_graph.squared_output_step`): the mean squared output in
    float32, which keeps a float32 tensor of the outputs' size as a cross-entropy keeps its
    gradient of the logits; the labels are not read."""
    import tensorflow as tf  # deferred: TensorFlow

    return tf.reduce_mean(tf.square(tf.cast(outputs, tf.float32)))


if __name__ == "__main__":
    print("PEAKS " + json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
