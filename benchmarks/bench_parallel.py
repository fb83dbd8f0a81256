"""Model and pipeline parallelism, measured: unsplit vs split step time, memory, stage overlap.

    python benchmarks/bench_parallel.py                       # 2 logical CPUs (no GPU visible)
    python benchmarks/bench_parallel.py --cpu_devices=4 --micro_batches=1,4,16 --batch_size=256
    python benchmarks/bench_parallel.py --model=resnet --input_shape=64,64,3   # on your GPUs

On the visible GPUs (else the CPU split into --cpu_devices logical devices, before
TensorFlow initializes them) it trains the same model, from the same initial weights,
on the same synthetic batches with the same SGD optimizer, as: the unsplit model; the
model split into K stages, one per device (`tfaccel.parallel.pipeline.model_parallel`,
M = 1); and the same stages as a GPipe pipeline with each of --micro_batches (M). The
"pipeline M=1" row runs the same computation as "model-parallel": the gap between the
two is the timing noise of the run. Every variant first trains --warmup untimed steps
(tracing) on the first batches, from the same initial weights: each step's loss must
equal the unsplit model's (rtol 1e-4) and the weights after them must be within 5% of
how far those steps moved the unsplit weights ("same as unsplit"; BatchNorm normalizes
per micro-batch, so a model with it is compared at M = 1 only). The comparison is made
there, not after all the steps: micro-batches sum the gradient in another order, and
training amplifies that rounding (measured: after 32 steps the unsplit model summing the
same 4 micro-batches by hand differs from its whole-batch self by 12% of the weights'
movement, pipeline M=4 by 13%; after 4 steps both by 0.03%). Then, --repeats times,
--steps timed steps (`monitor.time_fit`, the first step of each `fit` its warm-up), the
variants in turn and in reverse order on the next round, so that a busy spell of the
machine falls on all of them; a variant's step time is the median of its rounds'
medians. The table gives step time, examples/s, the ratio to the unsplit step time,
GPipe's theoretical bubble (K-1)/(M+K-1), the loss after all the steps, and memory: the
peak above the resting allocation during the timed steps (activations, gradients,
tensors sent between stages),
per device when each device has its own allocator (GPUs), and the plan's estimate per
stage. Logical CPU devices share ONE allocator (TensorFlow's pooled host allocator,
`use_pooled_host_allocator`; checked at start: a tensor placed on the last device shows
in the first device's statistics), so on CPU the measured peak is the process's, not a
device's; the output says so.

The default model is the zoo `cnn` (the digits CNN's layers: two 3x3 convolutions, a
2.1M-parameter dense layer) on 32x32x3 inputs, dropout off: a step has real compute
(~20M multiply-adds per example) in both stages, unlike the digits' 8x8, where each op
is so small that micro-batches would measure only per-op overhead; without dropout the
split variants must reproduce the unsplit losses exactly. Parameter balancing puts the
convolutions in stage 0 and the dense layers in stage 1 (the stage table is printed):
stage 0 does most of the work (~85% of the stages' busy time in the traces).

Overlap (--trace): after timing, --trace_steps steps of each split variant run under
`tf.profiler.experimental` into --output_dir/logs/trace_<variant> (TensorBoard's
profile tab shows it, with tensorboard-plugin-profile installed: it is not here); the
bench reads the .xplane.pb back (`tensorflow.tsl.profiler.protobuf.xplane_pb2`), finds
each stage's ops by their name scope (`stage_<k>/micro_batch_<i>/...` forward,
`gradient_tape/stage_<k>/micro_batch_<i>/...` and `stage_<k>/backward_<i>/...`
backward), on the GPU planes when there are any (kernels, named by their `tf_op`; not
tried here, where there is no GPU), else on the host's executor threads, and reports
for stages k and k+1: the fraction of stage k+1's busy time during which stage k was
busy ("overlap"), during which it was busy on another micro-batch ("pipelined": the
overlap GPipe's schedule is about; 0 at M = 1 by construction), and the fraction of
stage k+1's forward time during which stage k ran the forward of the next micro-batch
("gpipe fwd"), and per stage the fraction of its busy time during which it ran two
micro-batches at once ("2 at once"). On logical CPUs both "devices" share the machine's
cores and TensorFlow's inter-op threads: ops overlap there because the executor runs any
two ready ops at once, and overlap does not make a step faster when both ops need all
cores; on GPUs the same numbers say whether the devices really worked at the same time.

Writes bench_parallel.json, bench_parallel.png and TensorBoard logs (text table, scalars,
chart) under --output_dir. Targets (issue #14): pipeline with M = 4 takes at most 1.5x
the unsplit step time, and every comparable split variant is "same as unsplit"; exit
status 1 when either fails. --recompute makes the split variants recompute each stage's
activations in the backward pass.

Measured on a 2-core AMX Xeon (2 logical CPUs, the defaults), 2026-12-02, after each
stage's backward was cut at its inputs (load 1.3 at the start): step time unsplit 98 ms,
model-parallel 102 ms (1.05x), pipeline M=1 110 ms (1.13x), M=2 110 ms (1.12x), M=4
104 ms (1.06x: PASS, target <= 1.5x), M=8 106 ms (1.09x); per-round medians spread
+-20%, as much as the differences ("model-parallel" and "pipeline M=1" are the same
computation). On logical CPUs the split costs little and gains nothing. Every split
variant gave the unsplit warm-up losses (largest relative difference 1e-7) and weights.
Step peak above resting: 145-153 MB unsplit and M=1-2, 105-115 MB at M=4-8 (one shared
pool; it varies from run to run). Overlap, 3 profiled steps: M=1 0.00 (the stages take
turns), M=2 0.41, M=4 0.87, M=8 0.69, all of it on another micro-batch: TensorFlow's
executor does run stage 1 on one micro-batch while stage 0 works on another. The GPipe
forward pattern itself (stage 0 on micro-batch i+1 while stage 1 runs micro-batch i) was
0.00 in this run (0.00 / 0.25 / 0.05 for M = 2 / 4 / 8 in an earlier one), and each stage
ran two micro-batches at once for 49-78% (stage 0) and 7-50% (stage 1) of its busy time:
the executor runs whatever is ready on its inter-op threads, which the logical devices
share, and on 2 cores that interleaves the work without speeding it up (in the earlier
run stage 1's busy time grew from 50 ms at M=1 to 90-152 ms, its ops sharing the cores).
Runs under load 2-3 (other jobs) gave M=4 0.50-0.95x and overlaps of 0.17-0.92: measure
on a quiet machine.
"""

import inspect
import logging
import os
import re
import statistics
import sys

import _cli
from absl import flags

MAX_RATIO, TARGET_M = 1.5, 4
LOSS_RTOL, WEIGHT_TOL = 1e-4, 0.05
DATA_BATCHES = 4  # distinct synthetic batches, cycled

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "cnn", "Zoo model (tfaccel.train.models): mlp, cnn, resnet or "
                    "mobilenet_v2; dropout is turned off where the model has it.")
flags.DEFINE_list("input_shape", ["32", "32", "3"], "Shape of one synthetic input.")
flags.DEFINE_integer("num_classes", 10, "Classes of the synthetic labels.", lower_bound=2)
flags.DEFINE_integer("batch_size", 128, "Examples per step (every M must divide it).",
                     lower_bound=1)
flags.DEFINE_list("micro_batches", ["1", "2", "4", "8"], "Pipeline micro-batches M to time.")
flags.DEFINE_integer("stages", None, "Stages K (default: one per device).", lower_bound=2)
flags.DEFINE_integer("cpu_devices", 2, "Logical CPU devices to split the CPU into when no GPU "
                     "is visible.", lower_bound=2)
flags.DEFINE_integer("warmup", 4, "Untimed steps per variant (tracing), from the same initial "
                     "weights: their losses and the weights after them are compared with the "
                     "unsplit model's.", lower_bound=1)
flags.DEFINE_integer("steps", 10, "Timed steps per variant and round.", lower_bound=1)
flags.DEFINE_integer("repeats", 5, "Rounds over all variants (order reversed every other "
                     "round).", lower_bound=1)
flags.DEFINE_float("learning_rate", 0.05, "SGD learning rate.", lower_bound=0.0)
flags.DEFINE_bool("recompute", False, "Split variants recompute each stage's activations in "
                  "the backward pass.")
flags.DEFINE_bool("trace", True, "Profile --trace_steps steps of each split variant and "
                  "measure how much the stages' ops overlapped.")
flags.DEFINE_integer("trace_steps", 3, "Steps profiled per split variant (the overlap varies "
                     "from step to step).", lower_bound=1)
flags.DEFINE_integer("seed", 0, "Seed of the initial weights and the synthetic data.")
_cli.define_output_dir("runs/bench_parallel", "Where bench_parallel.json, the chart, the "
                       "traces and TensorBoard logs go.")


def _checked_flags():
    """(input shape, [M, ...]), or ConfigError: one line, before TensorFlow does any work."""
    from tfaccel.choices import MODELS
    from tfaccel.errors import ConfigError

    if FLAGS.model not in MODELS:
        raise ConfigError(f"--model={FLAGS.model}: use one of {', '.join(MODELS)}")
    try:
        shape = tuple(int(d) for d in FLAGS.input_shape)
        ms = [int(m) for m in FLAGS.micro_batches]
    except ValueError:
        raise ConfigError("--input_shape and --micro_batches take integers, e.g. "
                          "--input_shape=32,32,3 --micro_batches=1,2,4,8") from None
    if not ms or min(ms) < 1 or min(shape, default=0) < 1:
        raise ConfigError("--input_shape and --micro_batches need positive integers")
    bad = [m for m in ms if FLAGS.batch_size % m]
    if bad:
        raise ConfigError(f"--micro_batches={bad[0]} does not divide --batch_size="
                          f"{FLAGS.batch_size}: use divisors of the batch")
    return shape, list(dict.fromkeys(ms))


def _devices():
    """The stages' devices: the GPUs, else the CPU split (before TensorFlow initializes it)."""
    import tensorflow as tf

    from tfaccel.distribute.strategy import split_cpu
    from tfaccel.parallel.pipeline import parallel_devices

    if not tf.config.list_physical_devices("GPU"):
        split_cpu(FLAGS.cpu_devices)
    return parallel_devices()


def _allocators(devices):
    """Device names as the memory statistics take them, and whether they share one pool
    (measured: a 4 MB tensor placed on the last device shows up in the first one's)."""
    import tensorflow as tf

    names = [d.split("device:")[-1] for d in devices]
    before = tf.config.experimental.get_memory_info(names[0])["current"]
    with tf.device(devices[-1]):
        probe = tf.ones((1024, 1024))
    shared = tf.config.experimental.get_memory_info(names[0])["current"] - before >= 2**22
    del probe
    return names, bool(shared)


def _data(shape):
    """DATA_BATCHES batches of uniform inputs, labelled by a fixed random linear teacher."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(FLAGS.seed)
    n = DATA_BATCHES * FLAGS.batch_size
    x = rng.random((n, *shape), dtype=np.float32)
    teacher = rng.normal(size=(x[0].size, FLAGS.num_classes)).astype(np.float32)
    y = np.argmax((x - 0.5).reshape(n, -1) @ teacher, axis=1)  # learnable, so the loss moves
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(FLAGS.batch_size, drop_remainder=True)
    return ds.cache().repeat(), x, y


def _variants(shape, ms, devices):
    """[(name, M or None, compiled model)], all from the same initial weights; those weights."""
    from tfaccel.keras import keras
    from tfaccel.parallel import pipeline
    from tfaccel.train import models

    builder = getattr(models, FLAGS.model)
    options = {"dropout": 0.0} if "dropout" in inspect.signature(builder).parameters else {}
    k = FLAGS.stages or len(devices)
    split = {"devices": devices, "batch_size": FLAGS.batch_size}
    specs = [("unsplit", None), ("model-parallel", 1)] + [(f"pipeline M={m}", m) for m in ms]
    out = []
    for name, m in specs:
        keras.utils.set_random_seed(FLAGS.seed)
        model = models.build_model(FLAGS.model, shape, FLAGS.num_classes, **options)
        if name == "model-parallel":
            model = pipeline.model_parallel(model, k, **split)
        elif m is not None:
            model = pipeline.pipeline_parallel(model, k, micro_batches=m,
                                               recompute=FLAGS.recompute, **split)
        model.compile(keras.optimizers.SGD(FLAGS.learning_rate),
                      "sparse_categorical_crossentropy")
        out.append((name, m, model))
    return out, out[0][2].get_weights()


def _time_variants(variants, ds, allocators, shared):
    """{name: {'rounds': [median step s], 'peak': {device: bytes}, 'transient': {...}}}."""
    import tensorflow as tf

    from tfaccel import monitor

    pools = allocators[:1] if shared else allocators
    runs = {name: {"rounds": [], "peak": {}, "transient": {}} for name, _, _ in variants}
    for r in range(FLAGS.repeats):
        for name, _, model in (variants if r % 2 == 0 else variants[::-1]):
            for pool in pools:
                tf.config.experimental.reset_memory_stats(pool)
            resting = {p: tf.config.experimental.get_memory_info(p)["current"] for p in pools}
            times = monitor.time_fit(model, ds, FLAGS.steps, warmup=1)  # a fit's first step
            run = runs[name]
            run["rounds"].append(times.median)
            for p in pools:
                peak = tf.config.experimental.get_memory_info(p)["peak"]
                run["peak"][p] = max(run["peak"].get(p, 0), int(peak))
                run["transient"][p] = max(run["transient"].get(p, 0), int(peak - resting[p]))
        print(f"round {r + 1}/{FLAGS.repeats}: " + ", ".join(
            f"{name} {1000 * runs[name]['rounds'][-1]:.1f} ms" for name, _, _ in variants),
            flush=True)
    return runs


def _warm_up(model, x, y):
    """Trains --warmup steps (tracing) on the data's first batches, in order; returns each
    step's loss and the weights after them, to compare with the unsplit model's."""
    b = FLAGS.batch_size
    losses = []
    for i in range(FLAGS.warmup):
        j = (i % DATA_BATCHES) * b
        losses.append(float(model.train_on_batch(x[j:j + b], y[j:j + b])))
    return losses, _weights(model)


def _weights(model):
    return (model.placed if hasattr(model, "placed") else model).get_weights()


def _final_loss(model, x, y):
    """The loss on all the synthetic data after all the steps (the variant's own forward)."""
    import numpy as np

    from tfaccel.keras import keras

    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    b = FLAGS.batch_size
    return float(np.mean([float(loss_fn(y[i:i + b], model(x[i:i + b], training=False)))
                          for i in range(0, len(x), b)]))


def _tag(name):
    """'pipeline M=4' -> 'pipeline_M_4' (file and TensorBoard tag names)."""
    return re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_")


# ------------------------------------------------------------------ the profiler's trace
_SCOPE = re.compile(r"(?:^|/)(gradient_tape/)?stage_(\d+)/(?:micro_batch_(\d+)|backward_(\d+))/")


def _trace_events(path):
    """[(start ps, end ps, stage, micro-batch, backward?)] of the stages' ops in one xplane."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    gpus = [p for p in space.planes if p.name.startswith("/device:GPU:")]
    events = []
    for plane in gpus or [p for p in space.planes if p.name == "/host:CPU"]:
        tf_op = next((i for i, m in plane.stat_metadata.items() if m.name == "tf_op"), None)
        for line in plane.lines:
            for ev in line.events:
                meta = plane.event_metadata[ev.metadata_id]
                names = [meta.name, meta.display_name] + [
                    s.str_value or plane.stat_metadata[s.ref_value].name
                    for s in ev.stats if s.metadata_id == tf_op]
                match = next((m for m in map(_SCOPE.search, names) if m), None)
                if match is None:
                    continue
                start = line.timestamp_ns * 1000 + ev.offset_ps
                backward = bool(match.group(1) or match.group(4) is not None)
                events.append((start, start + ev.duration_ps, int(match.group(2)),
                               int(match.group(3) or match.group(4)), backward))
    return events


def overlap_report(events, num_stages):
    """Busy time per stage and, per adjacent pair, how much of stage k+1's busy time stage k
    was busy too (any micro-batch / another micro-batch / the next one's forward)."""
    events = [ev for ev in events if ev[1] > ev[0]]
    edges = sorted({t for s, e, *_ in events for t in (s, e)})
    active = {}  # (stage, micro-batch, backward) -> ops running now
    starts, ends = {}, {}
    for ev in events:
        starts.setdefault(ev[0], []).append(ev[2:])
        ends.setdefault(ev[1], []).append(ev[2:])
    busy, doubled = [0] * num_stages, [0] * num_stages
    pairs = [{"overlap": 0, "pipelined": 0, "forward": 0, "gpipe": 0}
             for _ in range(num_stages - 1)]
    for t, t_next in zip(edges, edges[1:]):
        for key in ends.get(t, ()):
            active[key] -= 1
        for key in starts.get(t, ()):
            active[key] = active.get(key, 0) + 1
        now = [key for key, n in active.items() if n > 0]
        width = t_next - t
        for k in {key[0] for key in now}:
            busy[k] += width
            doubled[k] += width if len({key[1] for key in now if key[0] == k}) > 1 else 0
        for k, pair in enumerate(pairs):
            here = [key[1:] for key in now if key[0] == k]
            there = [key[1:] for key in now if key[0] == k + 1]
            later = {i - 1 for i, back in here if not back}  # k+1 ran these forward earlier
            forward = [i for i, back in there if not back]
            pair["forward"] += width if forward else 0
            pair["overlap"] += width if here and there else 0
            pair["pipelined"] += width if any(i != j for i, _ in here for j, _ in there) else 0
            pair["gpipe"] += width if later.intersection(forward) else 0
    span = (edges[-1] - edges[0]) if edges else 0
    out = {"span_ms": span / 1e9, "stage_busy_ms": [b / 1e9 for b in busy], "pairs": [],
           "micro_batches_seen": [sorted({ev[3] for ev in events if ev[2] == k})
                                  for k in range(num_stages)],
           "backward_seen": [any(ev[4] for ev in events if ev[2] == k)
                             for k in range(num_stages)],
           "two_micro_batches_at_once": [d / (b or 1) for d, b in zip(doubled, busy)]}
    for k, pair in enumerate(pairs):
        denominator = busy[k + 1] or 1
        out["pairs"].append({
            "stages": [k, k + 1], "overlap": pair["overlap"] / denominator,
            "pipelined": pair["pipelined"] / denominator,
            "gpipe_forward": pair["gpipe"] / (pair["forward"] or 1)})
    return out


def _trace(model, name, ds, logdir):
    """Profiles --trace_steps training steps of `model` into logdir/trace_<name>; their
    overlap report (the fractions over all the steps' ops)."""
    import glob

    import tensorflow as tf

    folder = os.path.join(logdir, f"trace_{_tag(name)}")
    tf.profiler.experimental.start(folder)
    try:
        model.fit(ds, steps_per_epoch=FLAGS.trace_steps, epochs=1, verbose=0)
    finally:
        tf.profiler.experimental.stop()
    (path,) = sorted(glob.glob(os.path.join(folder, "plugins", "profile", "*", "*.xplane.pb")))[-1:]
    report = overlap_report(_trace_events(path), len(model.plan.stages))
    report["xplane"] = os.path.relpath(path, os.path.dirname(logdir))
    return report


# ------------------------------------------------------------------ the report
def _rows(variants, runs, warm, finals, initial, traces, plan, shared):
    """One table/JSON row per variant: times, ratios, bubble, memory, loss, overlap."""
    import numpy as np

    from tfaccel.performance.plan import bubble_fraction

    base_step = statistics.median(runs["unsplit"]["rounds"])
    base_losses, base_weights = warm["unsplit"]
    has_bn = any(type(layer).__name__ == "BatchNormalization"
                 for layer in variants[0][2].layers)
    k = len(plan.stages)
    moved = _norm(base_weights, initial) or 1.0
    rows = []
    for name, m, _ in variants:
        run, (losses, weights) = runs[name], warm[name]
        step = statistics.median(run["rounds"])
        row = {"variant": name, "micro_batches": m, "stages": 1 if m is None else k,
               "step_seconds": step, "round_seconds": run["rounds"], "ms/step": 1000 * step,
               "examples_per_sec": FLAGS.batch_size / step, "ratio": step / base_step,
               "bubble": 0.0 if m is None else bubble_fraction(k, m),
               "peak_bytes": run["peak"], "transient_bytes": run["transient"],
               "warmup_losses": losses, "loss_rel_diff": max(
                   abs(a - b) / abs(b) for a, b in zip(losses, base_losses)),
               "final_loss": finals[name], "final loss": finals[name],
               "weights_max_abs_diff": max(float(np.max(np.abs(a - b)))
                                           for a, b in zip(weights, base_weights)),
               "weights_rel_diff": _norm(weights, base_weights) / moved,
               "comparable": m is None or m == 1 or not has_bn}
        row["same_training"] = (row["loss_rel_diff"] <= LOSS_RTOL
                                and row["weights_rel_diff"] <= WEIGHT_TOL
                                ) if row["comparable"] else None
        row["examples/s"] = row["examples_per_sec"]
        row["same as unsplit"] = "-" if row["same_training"] is None else row["same_training"]
        row["step peak MB"] = " / ".join(f"{v / 1e6:,.1f}" for v in run["transient"].values())
        if shared:
            row["step peak MB"] += " (shared pool)"
        if name in traces:
            pairs = traces[name]["pairs"]
            row["trace"] = traces[name]
            row["overlap"] = " / ".join(f"{p['overlap']:.2f}" for p in pairs)
            row["pipelined"] = " / ".join(f"{p['pipelined']:.2f}" for p in pairs)
            row["gpipe fwd"] = " / ".join(f"{p['gpipe_forward']:.2f}" for p in pairs)
            row["2 at once"] = " / ".join(
                f"{f:.2f}" for f in traces[name]["two_micro_batches_at_once"])
        rows.append(row)
    return rows


def _norm(a, b):
    """The global L2 norm of the difference of two weight lists."""
    import numpy as np

    return float(np.sqrt(sum(np.sum(np.square(x - y)) for x, y in zip(a, b))))


def _checks(rows, k):
    """The issue's targets: M=4's step time ratio, and the split runs' loss and weights."""
    target = next((r for r in rows if r["variant"] == f"pipeline M={TARGET_M}"), None)
    checks = []
    if target is not None:
        checks.append({"target": f"pipeline M={TARGET_M} on {k} devices <= {MAX_RATIO}x the "
                                 "unsplit step time", "measured": target["ratio"],
                       "met": target["ratio"] <= MAX_RATIO})
    compared = [r for r in rows[1:] if r["comparable"]]
    checks.append({"target": f"split variants' {FLAGS.warmup} warm-up steps give the unsplit "
                             f"losses (rtol {LOSS_RTOL}) and weights (within {WEIGHT_TOL:.0%} "
                             "of how far the steps moved them)",
                   "measured": max(r["loss_rel_diff"] for r in compared),
                   "met": all(r["same_training"] for r in compared)})
    return checks


def main(argv):
    del argv
    from tfaccel.performance import memory

    shape, ms = _checked_flags()
    memory.use_pooled_host_allocator()  # before the first tensor: statistics on CPU too
    # Six models, six train functions: TensorFlow's "retracing" warning is expected here.
    logging.getLogger("tensorflow").addFilter(
        lambda record: "triggered tf.function retracing" not in record.getMessage())
    devices = _devices()
    from tfaccel import doctor, plots, summaries
    from tfaccel.errors import ConfigError

    k = FLAGS.stages or len(devices)
    if k > len(devices):
        fix = (f"--cpu_devices={k}" if "CPU" in devices[0] else
               f"--stages={len(devices)} or fewer")
        raise ConfigError(f"--stages={k} but only {len(devices)} device(s) "
                          f"({', '.join(devices)}): use {fix}")
    if k < 2:
        raise ConfigError(f"one device ({devices[0]}): a split needs 2 or more; hide the GPU "
                          "(CUDA_VISIBLE_DEVICES=) to split the CPU with --cpu_devices=N")
    allocators, shared = _allocators(devices[:k])
    ds, x, y = _data(shape)
    variants, initial = _variants(shape, ms, devices[:k])
    plan = variants[1][2].plan
    print(plan.table(), flush=True)
    warm = {name: _warm_up(model, x, y) for name, _, model in variants}
    runs = _time_variants(variants, ds, allocators, shared)
    finals = {name: _final_loss(model, x, y) for name, _, model in variants}
    out = FLAGS.output_dir
    logdir = os.path.join(out, "logs")
    traces = {name: _trace(model, name, ds, logdir) for name, m, model in variants
              if FLAGS.trace and m is not None}
    rows = _rows(variants, runs, warm, finals, initial, traces, plan, shared)
    checks = _checks(rows, k)
    columns = ["variant", "ms/step", "examples/s", "ratio", "bubble", "same as unsplit",
               "final loss", "step peak MB"]
    columns += ["overlap", "pipelined", "gpipe fwd", "2 at once"] if traces else []
    table = summaries.markdown_table(rows, columns)
    if shared:
        pools = (f"all {k} logical devices share ONE host allocator, so it is the process's "
                 "peak, not a device's")
    else:
        pools = f"one number per device: {', '.join(allocators)}"
    memory_note = (f"memory: 'step peak' is the allocator's peak above its resting allocation "
                   f"during the timed steps (largest round); {pools}; the stage table gives "
                   "the memory planner's estimate per stage")
    header = (f"{FLAGS.model} on synthetic {'x'.join(map(str, shape))}, batch "
              f"{FLAGS.batch_size}, SGD {FLAGS.learning_rate}"
              f"{', recompute' if FLAGS.recompute else ''}; {k} stages on "
              f"{', '.join(devices[:k])}; median step of {FLAGS.repeats} rounds x "
              f"{FLAGS.steps} steps; {doctor.machine_summary()}")
    overlap_note = (f"overlap ({FLAGS.trace_steps} profiled steps, stages k/k+1): fraction "
                    "of stage k+1's busy time with stage k busy (any micro-batch / another "
                    "micro-batch), and of its forward time with stage k on the next "
                    "micro-batch's forward; '2 at once': fraction of each stage's busy time "
                    "during which it ran two micro-batches at the same time"
                    + ("" if "GPU" in devices[0] else
                       "; logical CPUs share the cores and inter-op threads"))
    verdicts = [f"{'PASS' if c['met'] else 'FAIL'}  {c['target']}: {c['measured']:.4g}"
                for c in checks]
    report = "\n\n".join([header, plan.table(), table, memory_note]
                         + ([overlap_note] if traces else []) + ["\n".join(verdicts)])
    print(f"\n{report}")
    met = all(c["met"] for c in checks)
    png = plots.plot_rates(
        [f"{r['variant']} ({r['ratio']:.2f}x, bubble {r['bubble']:.2f})" for r in rows],
        [r["examples_per_sec"] for r in rows], os.path.join(out, "bench_parallel.png"),
        "examples/s (ratio: step time / unsplit)", header)
    _cli.write_outputs("bench_parallel", {
        "machine": doctor.machine_summary(), "devices": devices[:k],
        "allocators": allocators, "shared_allocator": shared, "model": FLAGS.model,
        "input_shape": list(shape), "batch_size": FLAGS.batch_size, "stages": k,
        "micro_batches": ms, "steps": FLAGS.steps, "warmup": FLAGS.warmup,
        "repeats": FLAGS.repeats, "learning_rate": FLAGS.learning_rate,
        "recompute": FLAGS.recompute, "plan": plan.to_json(), "rows": rows, "checks": checks,
        "met": met, "command": " ".join(["python", *sys.argv])}, report, png,
        {f"bench_parallel/{_tag(r['variant'])}_ratio": r["ratio"] for r in rows})
    return 0 if met else 1


if __name__ == "__main__":
    _cli.run(main)
