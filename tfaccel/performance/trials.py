"""Timed trials on the real model and data: the fastest precision/XLA setting, the best batch.

`auto_select` (the recipes' `--precision=auto` and `--jit_compile=auto`) trains
a copy of the model under each candidate precision and XLA setting for a few
steps and keeps the fastest, never one slower than float32 without XLA.

`find_batch_size` (`--batch_size=auto`) trains a copy at growing batch sizes
(16, 32, 64, ... by default), a few timed steps each, and stops at the first
out-of-memory error (GPU), at the first size whose peak memory exceeds a
budget (CPU, where running out of memory means swapping or being killed
instead of an error), or when throughput has stopped improving. It returns
the size with the highest examples/s and the table of everything it measured.
`search_batch_size` is the same search around any `measure` function, which
is how the stopping rules are tested. A larger batch changes the
optimization, not just the speed: consider scaling the learning rate with it.

Example:

    from tfaccel.performance import trials

    choice = trials.auto_select(model, train_ds, batch_size=64)
    print(choice.precision, choice.jit_compile)
    result = trials.find_batch_size(model, splits.train, max_batch_size=512)
    print(result.batch_size)
    for row in result.table:
        print(row)
"""

import dataclasses

import tensorflow as tf
from absl import logging

from tfaccel import monitor
from tfaccel.choices import PRECISIONS
from tfaccel.errors import ConfigError, ModelError, first_line
from tfaccel.keras import keras
from tfaccel.performance import memory, precision
from tfaccel.train.training import compile_classifier


def _default_compile(model, precision_name=None, jit_compile=False):
    """Compiles a trial copy as a classifier with Adam, loss-scaled under float16.

    `precision_name` defaults to the global policy (the one the copy was built under).
    """
    name = precision_name or keras.mixed_precision.global_policy().name
    compile_classifier(model, precision.wrap_optimizer(keras.optimizers.Adam(1e-3), name),
                       jit_compile=jit_compile)


# ---------------------------------------------------------------- precision and XLA

BASELINE = ("float32", False)
"""The setting `auto_select` compares against and falls back to."""
MIN_SPEEDUP = 1.05
"""How much faster than the baseline `auto_select` needs another setting to measure."""


@dataclasses.dataclass(frozen=True)
class AutoChoice:
    """What `auto_select` measured and kept."""

    precision: str
    jit_compile: bool
    table: tuple
    """One dict per candidate: precision, jit_compile, ms_per_step, examples_per_sec, speedup."""


def choose_fastest(timings, baseline=BASELINE, min_speedup=1.0):
    """The fastest setting of `timings`, never one slower than `baseline`.

    Args:
      timings: {(precision, jit_compile): seconds_per_step}; must include `baseline`.
      baseline: the setting to beat (float32 without XLA unless the precision is fixed).
      min_speedup: another setting wins only if it is at least this many times
        faster than the baseline (1.0: any measured gain).

    Returns:
      The chosen (precision, jit_compile).
    """
    if baseline not in timings:
        raise ConfigError(f"timings of {sorted(timings)} lack the baseline {baseline}")
    best = min(timings, key=timings.get)
    if timings[baseline] / timings[best] < min_speedup:
        return baseline
    return best


def auto_select(model, dataset, batch_size, precisions=PRECISIONS, jit_options=(False, True),
                compile_fn=None, warmup=2, steps=8, rounds=3, drop_slower_than=3.0,
                min_speedup=MIN_SPEEDUP):
    """Times precision and XLA settings on `model` and `dataset`, and keeps the fastest.

    First every precision is timed without XLA, then XLA on and off for the
    fastest precision (a coordinate search: 4 settings instead of 6 for
    `--precision=auto --jit_compile=auto`). Each setting trains its own copy of
    `model` (same weights; `model` itself is untouched), compiled and warmed up
    first; then the settings take turns for `rounds` rounds of `steps` steps,
    so that other load on the machine hits them alike, and each keeps its best
    round (the median step time of a round; contention only ever slows a
    round down). A setting more than `drop_slower_than` times slower than the
    best after a round cannot win and is not timed again. A round of a setting
    is cut to the steps that fit in `drop_slower_than` times the fastest
    setting's round (at least one; paced by the last step time known, the
    warm-up's at first), so that a setting 100x slower (float16 on most CPUs)
    costs a few steps, not a long round. The baseline is
    float32 without XLA (or the one precision given, without XLA), and another
    setting wins only if it measured at least `min_speedup` times faster (5%
    by default: smaller gaps are within a short trial's noise, and XLA or half
    precision bring costs of their own), so the choice is never slower than
    the baseline as measured. The global policy is restored.

    Example:

        choice = auto_select(model, train_ds, batch_size=64)
        print(choice.precision, choice.jit_compile)

    Args:
      model: a built Functional or Sequential tf_keras model.
      dataset: the batched training dataset.
      batch_size: its global batch size (for examples/s).
      precisions: candidate precisions, e.g. `PRECISIONS` or ('mixed_float16',).
      jit_options: candidate XLA settings, e.g. (False, True) or (False,).
      compile_fn: `fn(model, precision, jit_compile)` compiling a copy as training
        will (default: classifier loss, Adam, loss scaling for float16).
      warmup: untimed steps of each setting (tracing, XLA compilation).
      steps: timed steps per round.
      rounds: timed rounds per setting.
      drop_slower_than: see above.
      min_speedup: see `choose_fastest`.

    Returns:
      An `AutoChoice` whose table lists every setting tried.
    """
    precisions = tuple(precision.check_precision(p) for p in precisions)
    jit_options = tuple(bool(j) for j in jit_options)
    if not precisions or not jit_options:
        raise ConfigError("auto_select needs at least one precision and one jit_compile option")
    compile_fn = compile_fn or _default_compile
    first_jit = False if False in jit_options else jit_options[0]
    baseline = ("float32" if "float32" in precisions else precisions[0], first_jit)
    copies, timings, measured_rounds, probes = {}, {}, {}, {}

    def prepare(key):
        with precision.precision_scope(key[0]):
            copies[key] = precision.apply_precision(model, key[0], copy=True)
            compile_fn(copies[key], *key)
            probes[key] = monitor.time_training(copies[key], dataset, batch_size, warmup,
                                                1)["seconds_per_step"]

    def measure(keys):
        active = list(keys)
        for _ in range(rounds):
            pace = {k: timings.get(k, probes[k]) for k in active}
            budget = drop_slower_than * steps * min(pace.values())
            for key in active:  # a far slower setting gets fewer steps (>= 1), not a long round
                n = max(1, min(steps, int(budget / pace[key])))
                seconds = monitor.time_training(copies[key], dataset, batch_size, 1,
                                                n)["seconds_per_step"]
                timings[key] = min(timings.get(key, float("inf")), seconds)
                measured_rounds[key] = measured_rounds.get(key, 0) + 1
                logging.info("auto trial %s jit_compile=%s: %.2f ms/step", *key, 1000 * seconds)
            fastest = min(timings[k] for k in active)
            active = [k for k in active if timings[k] <= drop_slower_than * fastest]

    try:
        stage1 = [(p, first_jit) for p in sorted(precisions, key=lambda p: p != baseline[0])]
        for key in stage1:
            prepare(key)
        measure(stage1)
        best_precision = choose_fastest(timings, baseline, min_speedup)[0]
        for key in [k for k in stage1 if k[0] != best_precision and k != baseline]:
            del copies[key]
        stage2 = [(best_precision, jit) for jit in jit_options]
        if len(stage2) > 1:
            for key in stage2:
                if key not in copies:
                    prepare(key)
            measure(stage2)
    finally:
        copies.clear()
        memory.free_memory()
    table = tuple({"precision": p, "jit_compile": j, "ms_per_step": 1000 * t,
                   "examples_per_sec": batch_size / t, "speedup": timings[baseline] / t,
                   "rounds": measured_rounds[(p, j)]} for (p, j), t in timings.items())
    chosen = choose_fastest(timings, baseline, min_speedup)
    return AutoChoice(precision=chosen[0], jit_compile=chosen[1], table=table)


# ---------------------------------------------------------------- batch size

OK, OUT_OF_MEMORY, OVER_BUDGET = "ok", "out of memory", "over memory budget"


@dataclasses.dataclass(frozen=True)
class BatchSizeResult:
    """The chosen batch size and one row per size tried."""

    batch_size: int
    table: tuple
    """Dicts: batch_size, status, examples_per_sec, ms_per_step, peak_memory_mb."""


def candidate_sizes(start=16, max_batch_size=1024):
    """Powers of two from `start` up to `max_batch_size` (inclusive)."""
    if start < 1 or max_batch_size < start:
        raise ConfigError(f"batch-size search range {start}..{max_batch_size} is empty: need "
                          "1 <= start <= max_batch_size")
    sizes, size = [], int(start)
    while size <= max_batch_size:
        sizes.append(size)
        size *= 2
    return sizes


def search_batch_size(measure, candidates, memory_budget_mb=None, patience=2):
    """Tries `candidates` in order with `measure`; returns the fastest that fit.

    Args:
      measure: `fn(batch_size) -> {'examples_per_sec', 'seconds_per_step',
        'peak_memory_mb'}`; raises `tf.errors.ResourceExhaustedError` when out of memory.
      candidates: increasing batch sizes.
      memory_budget_mb: a size whose peak memory exceeds this is rejected and
        ends the search (None: no budget).
      patience: stop after this many sizes in a row without a new best throughput.

    Returns:
      A `BatchSizeResult`.

    Raises:
      ConfigError: not even the first candidate fits.
    """
    table, best, since_best = [], None, 0
    for size in candidates:
        try:
            m = measure(size)
        except tf.errors.ResourceExhaustedError:
            table.append({"batch_size": size, "status": OUT_OF_MEMORY})
            logging.info("batch size %d: out of memory", size)
            break
        row = {"batch_size": size, "status": OK, "examples_per_sec": m["examples_per_sec"],
               "ms_per_step": 1000 * m["seconds_per_step"], "peak_memory_mb": m["peak_memory_mb"]}
        if memory_budget_mb is not None and m["peak_memory_mb"] > memory_budget_mb:
            row["status"] = OVER_BUDGET
            table.append(row)
            break
        table.append(row)
        logging.info("batch size %d: %.0f examples/s", size, row["examples_per_sec"])
        if best is None or row["examples_per_sec"] > best["examples_per_sec"]:
            best, since_best = row, 0
        else:
            since_best += 1
            if since_best >= patience:
                break
    if best is None:
        raise ConfigError(f"no batch size fits: {table[0]['batch_size']} already ran "
                          f"{table[0]['status']}; lower the start size, raise the memory budget "
                          "or use a smaller model")
    return BatchSizeResult(batch_size=best["batch_size"], table=tuple(table))


def measure_batch_size(model, dataset, batch_size, compile_fn=None, warmup=2, steps=5):
    """Throughput and peak memory of training a copy of `model` at `batch_size`.

    Args:
      model: a built Functional or Sequential tf_keras model (left untouched).
      dataset: the unbatched training dataset of `(x, y)`, or `fn(batch_size)`
        returning the batched one (e.g. built by `tfaccel.data.build_pipeline`).
      batch_size: global batch size to try.
      compile_fn: `fn(model)` compiling the copy as training will (default:
        classifier loss, Adam, loss scaling under mixed_float16).
      warmup, steps: untimed and timed steps.

    Returns:
      {'examples_per_sec', 'seconds_per_step', 'steps_per_sec', 'peak_memory_mb'}.
    """
    try:
        trial = keras.models.clone_model(model)
    except ValueError as e:
        raise ModelError(f"batch-size search needs a Functional or Sequential model to copy, "
                         f"{model.name!r} is not ({first_line(e)})") from None
    trial.set_weights(model.get_weights())
    (compile_fn or _default_compile)(trial)
    if callable(dataset):
        batches = dataset(batch_size)
    else:
        batches = dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
    memory.reset_peak_memory()
    try:
        measured = monitor.time_training(trial, batches, batch_size, warmup, steps)
        measured["peak_memory_mb"] = max(memory.peak_memory_mb().values())
    finally:
        del trial
        memory.free_memory()
    return measured


def default_memory_budget_mb():
    """On CPU: current RSS plus half the memory still available; None with GPUs (OOM decides)."""
    import psutil

    if memory.gpu_devices():
        return None
    return memory.rss_mb() + 0.5 * psutil.virtual_memory().available / (1024 * 1024)


def find_batch_size(model, dataset, compile_fn=None, start=16, max_batch_size=1024,
                    memory_budget_mb="default", patience=2, warmup=2, steps=5):
    """Searches growing batch sizes on the real model and data (see module doc).

    Args:
      model: a built Functional or Sequential tf_keras model (left untouched).
      dataset: the unbatched training dataset, or `fn(batch_size)` returning
        the batched one.
      compile_fn: see `measure_batch_size`.
      start, max_batch_size: the range of powers of two to try.
      memory_budget_mb: peak-memory budget in MB; 'default' uses
        `default_memory_budget_mb()`, None disables it.
      patience: see `search_batch_size`.
      warmup, steps: untimed and timed steps per size.

    Returns:
      A `BatchSizeResult`.
    """
    if memory_budget_mb == "default":
        memory_budget_mb = default_memory_budget_mb()
    candidates = candidate_sizes(start, max_batch_size)
    return search_batch_size(
        lambda size: measure_batch_size(model, dataset, size, compile_fn, warmup, steps),
        candidates, memory_budget_mb=memory_budget_mb, patience=patience)
