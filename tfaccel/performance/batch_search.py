"""`--batch_size=auto`: timed trials of growing batch sizes, under a time budget.

`find_batch_size` trains a copy of the model at growing batch sizes (16, 32,
64, ... by default), a few timed steps each, and stops at the first
out-of-memory error (GPU), at the first size whose peak memory exceeds a
budget (CPU, where running out of memory means swapping or being killed
instead of an error), when throughput has stopped improving, or when its time
budget is spent (by default 10% of one epoch at the best size so far, or 60 s,
whichever is larger: `tfaccel.performance.budget`). A size is not started when
it would take more than the budget left (its predicted cost: the last size's
times the ratio of sizes). It returns the size with the highest examples/s and
the table of everything it measured or skipped, and says why it stopped.
`search_batch_size` is the same search around any `measure` function, which is
how the stopping rules are tested. A larger batch changes the optimization, not
just the speed: consider scaling the learning rate with it.

Example:

    from tfaccel.performance import batch_search

    result = batch_search.find_batch_size(model, splits.train, max_batch_size=512)
    print(result.batch_size, result.stopped)
    for row in result.table:
        print(row)
"""

import dataclasses
import time

import psutil
import tensorflow as tf
from absl import logging

from tfaccel import monitor
from tfaccel.errors import ConfigError
from tfaccel.keras import copy_model, keras
from tfaccel.performance import memory
from tfaccel.train import precision
from tfaccel.train.training import compile_classifier

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


def timed_steps(model, dataset, steps, deadline=None, clock=time.perf_counter):
    """Trains a compiled `model` for up to `steps` steps of `dataset.repeat()`; their seconds.

    `tfaccel.monitor.time_fit` with no warm-up, as a list (kept for its callers):
    training stops early after the step during which `clock()` passed
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
    return list(monitor.time_fit(model, dataset, steps, deadline=deadline, clock=clock).seconds)


def first_step_batch(batch_size, multiple=1):
    """The small batch of the first-step check: batch_size / 32 (or the nearest larger
    fraction of it that is a multiple of `multiple`, e.g. replicas x accumulation steps)."""
    for divisor in (32, 16, 8, 4, 2):
        if batch_size % divisor == 0 and (batch_size // divisor) % multiple == 0:
            return batch_size // divisor
    return batch_size

OK, OUT_OF_MEMORY, OVER_BUDGET = "ok", "out of memory", "over memory budget"
NOT_TRIED = "not tried"
PLANNED_OUT = "does not fit (plan)"
"""The status of a size the time budget left no room for."""


def default_compile(model, precision_name=None, jit_compile=False):
    """Compiles a trial copy as a classifier with Adam, loss-scaled under float16.

    `precision_name` defaults to the global policy (the one the copy was built under).
    """
    name = precision_name or keras.mixed_precision.global_policy().name
    compile_classifier(model, precision.wrap_optimizer(keras.optimizers.Adam(1e-3), name),
                       jit_compile=jit_compile)


@dataclasses.dataclass(frozen=True)
class BatchSizeResult:
    """The chosen batch size and one row per size tried."""

    batch_size: int
    table: tuple
    """Dicts: batch_size, status, examples_per_sec, ms_per_step, peak_memory_mb, seconds
    (a size not tried has a `note` instead)."""
    seconds: float = 0.0
    """Wall time of the whole search."""
    budget_seconds: float = float("inf")
    """The time budget it had (inf: none)."""
    stopped: str = ""
    """Why the search ended before the last candidate ('' when it did not)."""


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


def search_batch_size(measure, candidates, memory_budget_mb=None, patience=2,
                      budget_seconds=None, num_examples=None, clock=time.perf_counter,
                      fits=None):
    """Tries `candidates` in order with `measure`; returns the fastest that fit.

    Args:
      measure: `fn(batch_size) -> {'examples_per_sec', 'seconds_per_step',
        'peak_memory_mb'}`; raises `tf.errors.ResourceExhaustedError` when out of memory.
      candidates: increasing batch sizes.
      memory_budget_mb: a size whose peak memory exceeds this is rejected and
        ends the search (None: no budget).
      patience: stop after this many sizes in a row without a new best throughput.
      budget_seconds: wall seconds the search may take: a number, 'default'
        (10% of one epoch of `num_examples` at the best throughput so far, or
        60 s, whichever is larger) or None (no time budget).
      num_examples: examples in one epoch, for the default budget.
      clock: the clock the budget is measured on.
      fits: optional `fn(batch_size) -> None or a reason`: a size with a reason (e.g. a
        memory plan that does not fit the device) is not measured and ends the search.

    Returns:
      A `BatchSizeResult`.

    Raises:
      ConfigError: not even the first candidate fits.
    """
    table, best, since_best, stopped = [], None, 0, ""
    start = clock()
    last = None  # (size, seconds) of the last size measured
    for size in candidates:
        epoch = num_examples / best["examples_per_sec"] if best and num_examples else None
        total = resolve_budget(budget_seconds, epoch)
        left = total - (clock() - start)
        needed = last[1] * size / last[0] if last else 0.0
        if last and needed > left:
            stopped = (f"time budget of {total:.0f} s: {max(left, 0):.0f} s left, size {size} "
                       f"would take about {needed:.0f} s")
            table.append({"batch_size": size, "status": NOT_TRIED, "note": stopped})
            logging.info("batch size search stopped: %s", stopped)
            break
        reason = fits(size) if fits is not None else None
        if reason:
            table.append({"batch_size": size, "status": PLANNED_OUT, "note": reason})
            stopped = f"size {size}: {reason}"
            break
        began = clock()
        try:
            m = measure(size)
        except tf.errors.ResourceExhaustedError:
            table.append({"batch_size": size, "status": OUT_OF_MEMORY})
            logging.info("batch size %d: out of memory", size)
            stopped = f"size {size} ran out of memory"
            break
        last = (size, clock() - began)
        row = {"batch_size": size, "status": OK, "examples_per_sec": m["examples_per_sec"],
               "ms_per_step": 1000 * m["seconds_per_step"], "peak_memory_mb": m["peak_memory_mb"],
               "seconds": last[1]}
        if memory_budget_mb is not None and m["peak_memory_mb"] > memory_budget_mb:
            row["status"] = OVER_BUDGET
            table.append(row)
            stopped = f"size {size} went over the memory budget of {memory_budget_mb:.0f} MB"
            break
        table.append(row)
        logging.info("batch size %d: %.0f examples/s", size, row["examples_per_sec"])
        if best is None or row["examples_per_sec"] > best["examples_per_sec"]:
            best, since_best = row, 0
        else:
            since_best += 1
            if since_best >= patience:
                stopped = f"{patience} sizes in a row without a faster one"
                break
    if best is None:
        first = table[0]
        why = (f"{first['status']}: {first['note']}" if first["status"] == PLANNED_OUT
               else f"already ran {first['status']}")
        raise ConfigError(f"no batch size fits: {first['batch_size']} {why}; lower the start "
                          "size, raise the memory budget or use a smaller model")
    epoch = num_examples / best["examples_per_sec"] if num_examples else None
    return BatchSizeResult(batch_size=best["batch_size"], table=tuple(table),
                           seconds=clock() - start,
                           budget_seconds=resolve_budget(budget_seconds, epoch),
                           stopped=stopped)


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
    trial = copy_model(model, "time a batch size on a copy of")
    (compile_fn or default_compile)(trial)
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

    if memory.gpu_devices():
        return None
    return memory.rss_mb() + 0.5 * psutil.virtual_memory().available / (1024 * 1024)


def find_batch_size(model, dataset, compile_fn=None, start=16, max_batch_size=1024,
                    memory_budget_mb="default", patience=2, warmup=2, steps=5,
                    budget_seconds=DEFAULT, num_examples=None, fits=None):
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
      budget_seconds, num_examples: the time budget, see `search_batch_size`
        (`num_examples` defaults to the cardinality of an unbatched `dataset`).
      fits: sizes to skip before measuring, see `search_batch_size`.

    Returns:
      A `BatchSizeResult`.
    """
    if memory_budget_mb == "default":
        memory_budget_mb = default_memory_budget_mb()
    if num_examples is None and isinstance(dataset, tf.data.Dataset):
        count = int(dataset.cardinality())
        num_examples = count if count > 0 else None
    candidates = candidate_sizes(start, max_batch_size)
    return search_batch_size(
        lambda size: measure_batch_size(model, dataset, size, compile_fn, warmup, steps),
        candidates, memory_budget_mb=memory_budget_mb, patience=patience,
        budget_seconds=budget_seconds, num_examples=num_examples, fits=fits)
