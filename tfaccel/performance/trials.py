"""Timed trials on the real model and data: the fastest precision/XLA setting, the best batch.

`auto_select` (the recipes' `--precision=auto` and `--jit_compile=auto`) trains
a copy of the model under each candidate precision and XLA setting for a few
steps and keeps the fastest, never one slower than float32 without XLA. The
trials have a time budget (by default 10% of one epoch or 60 s, whichever is
larger), shared equally by the settings; each setting's copying, tracing, XLA
compilation and steps count against its share, and a setting whose first steps
(on a small batch) are far slower than float32's is dropped before it trains a
full-size step. A step cannot be stopped once started, so under heavy load the
budget is kept by not starting: a setting is not tried (and says so in the table)
once the budget is spent, or when float32's first steps alone took longer than its
share. `search_settings` is the same search around any `measure`
function, which is how its rules are tested.

The batch-size search (`--batch_size=auto`) is `tfaccel.performance.batch_search`;
its names are importable from here too.

Example:

    from tfaccel.performance import trials

    choice = trials.auto_select(model, train_ds, batch_size=64, steps_per_epoch=100)
    print(choice.precision, choice.jit_compile, f"{choice.seconds:.0f} s")
    for row in choice.table:
        print(row)  # precision, jit_compile, status, ms_per_step, ..., note
"""

import dataclasses
import time

from absl import logging

from tfaccel import monitor
from tfaccel.choices import PRECISIONS
from tfaccel.errors import ConfigError
from tfaccel.performance import batch_search, memory
from tfaccel.performance.batch_search import (  # noqa: F401 (their old home: tfaccel.batch_size)
    NOT_TRIED,
    OK,
    OUT_OF_MEMORY,
    OVER_BUDGET,
    BatchSizeResult,
    candidate_sizes,
    default_compile,
    default_memory_budget_mb,
    find_batch_size,
    measure_batch_size,
    search_batch_size,
)
from tfaccel.train import precision

BASELINE = ("float32", False)
"""The setting `auto_select` compares against and falls back to."""
MIN_SPEEDUP = 1.05
"""How much faster than the baseline `auto_select` needs another setting to measure."""
MEASURED, BUDGET_SPENT, DROPPED = "measured", "budget spent", "dropped"
"""A trial's status: all its rounds ran; its share of the budget ran out (it keeps the rounds
it had, if any); it cannot win and was not timed again (see its note)."""
FIRST, WARMUP, ROUND = "first steps", "warm-up", "round"
"""What `search_settings` asks its `measure` function to run."""


@dataclasses.dataclass(frozen=True)
class AutoChoice:
    """What `auto_select` measured and kept."""

    precision: str
    jit_compile: bool
    table: tuple
    """One dict per setting tried: precision, jit_compile, status, ms_per_step,
    examples_per_sec, speedup (only once timed at full batch), rounds, seconds, note."""
    seconds: float = 0.0
    """Wall time of all the trials."""
    budget_seconds: float = float("inf")
    """The trials' time budget (as finally computed, from the epoch time measured)."""


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


class _Search:
    """The state of one `search_settings` call: every setting's costs, pace and timing."""

    def __init__(self, measure, baseline, settings, budget_seconds, steps_per_epoch, clock):
        self.measure, self.baseline, self.clock = measure, baseline, clock
        self.settings, self.budget_seconds = settings, budget_seconds
        self.steps_per_epoch, self.start, self.rows = steps_per_epoch, clock(), {}
        batch_search.resolve_budget(budget_seconds)  # a bad budget fails before any trial

    def total(self):
        timing = self.rows.get(self.baseline, {}).get("timing")
        epoch = self.steps_per_epoch * timing if self.steps_per_epoch and timing else None
        return batch_search.resolve_budget(self.budget_seconds, epoch)

    def left(self, key):
        return self.total() / self.settings - self.rows[key]["seconds"]

    def run(self, key, kind, steps, bounded=True):
        row = self.rows.setdefault(key, {"seconds": 0.0, "rounds": 0, "timing": None,
                                         "status": None, "note": ""})
        began = self.clock()
        with precision.precision_scope(key[0]):
            deadline = began + self.left(key) if bounded else float("inf")
            times = list(self.measure(key, kind, steps, deadline))
        row["last"] = self.clock() - began
        row["seconds"] += row["last"]
        return times

    def end(self, key, status, note):
        self.rows[key].update(status=status,
                              note="; ".join(n for n in (self.rows[key]["note"], note) if n))
        logging.info("auto trial %s jit_compile=%s %s: %s", *key, status, note)

    def spent(self):
        return self.clock() - self.start

    def affordable(self, key, baseline_first):
        """False (and `key` ended, not tried) when the budget is spent, or when the baseline's
        first steps (copy, tracing, small steps) took longer than `key`'s whole share: a step
        cannot be stopped once started, so a setting is not started unless it can fit."""
        self.rows[key] = {"seconds": 0.0, "rounds": 0, "timing": None, "status": None,
                          "note": ""}
        if self.spent() >= self.total():
            self.end(key, BUDGET_SPENT, f"not tried: the trials' {self.total():.0f} s budget "
                     f"was spent ({self.spent():.1f} s so far)")
            return False
        if baseline_first > self.left(key):
            self.end(key, BUDGET_SPENT, f"not tried: {self.baseline[0]}'s first steps took "
                     f"{baseline_first:.1f} s, more than this setting's {self.left(key):.1f} s "
                     "share")
            return False
        return True

    def live(self, keys):
        return [k for k in keys if self.rows[k]["status"] is None]


def search_settings(measure, precisions=PRECISIONS, jit_options=(False, True), batch_size=None,
                    warmup=2, steps=8, rounds=3, drop_slower_than=3.0, first_steps=2,
                    first_step_slower_than=10.0, min_speedup=MIN_SPEEDUP,
                    budget_seconds=batch_search.DEFAULT, steps_per_epoch=None, advice=None,
                    clock=time.perf_counter):
    """The precision/XLA search of `auto_select` around any `measure` function.

    First every precision is timed without XLA, then XLA on and off for the
    fastest precision (a coordinate search: 4 settings instead of 6 for both
    `auto`). Each setting runs, in this order: `first_steps` steps on a small
    batch (the same for every setting; the first step traces the train step),
    and is dropped if the fastest of the others is over
    `first_step_slower_than` times the baseline's (up to 3 times over, after
    two more steps); `warmup` full-batch steps
    (tracing again for the full shape);
    then the settings take turns for `rounds` rounds of up to `steps` timed
    steps, so that other load hits them alike, each keeping its best round (a
    round's median step time). A round is cut to the steps that fit in
    `drop_slower_than` times the fastest setting's round, and a setting more
    than `drop_slower_than` times slower than the fastest after a round is
    dropped. The budget is shared equally by the settings: what a setting's
    calls take (copying, compiling, tracing, steps) counts against its share,
    each call ends after the step that spends it, a warm-up is not started
    when the share left is less than the baseline's warm-up scaled by how much
    longer this setting's first steps took, a round gets the steps its pace
    says fit, and a setting out of budget keeps the rounds it had. The
    baseline is float32 without XLA (or the one precision given); no other
    setting is started once the budget is spent or when the baseline's first
    steps took longer than its share (status "budget spent", note "not tried:
    ..."), so the trials end within the budget plus the baseline's own first
    steps and warm-up, and at most one setting's overrun. Another
    setting wins only if at least `min_speedup` times faster (see
    `choose_fastest`).

    Args:
      measure: `fn(key, kind, steps, deadline) -> [seconds of each step run]`
        for key (precision, jit_compile), kind `FIRST` (small batch), `WARMUP`
        or `ROUND` (full batch; a round's first step is not timed), running
        up to `steps` steps and stopping after the step that passes `deadline`
        (a `clock()` value). It runs under the key's global policy. An object
        with a `release(key)` method is told when a copy is no longer needed.
      precisions, jit_options: the candidates.
      batch_size: the global batch size, for examples/s in the table (None: not shown).
      warmup, steps, rounds, drop_slower_than, first_steps,
        first_step_slower_than: see above.
      min_speedup: see `choose_fastest`.
      budget_seconds: the trials' wall-clock budget: seconds, `batch_search.DEFAULT`
        (10% of one epoch of `steps_per_epoch` baseline steps, or 60 s,
        whichever is larger) or None (unlimited).
      steps_per_epoch: training steps per epoch, for the default budget.
      advice: `fn(precision) -> [warnings]` (e.g. `precision_advice`); the
        first warning is added to the note of a setting that did not win.
      clock: the clock the budget is measured on.

    Returns:
      An `AutoChoice`.
    """
    precisions = tuple(precision.check_precision(p) for p in precisions)
    jit_options = tuple(bool(j) for j in jit_options)
    if not precisions or not jit_options:
        raise ConfigError("auto_select needs at least one precision and one jit_compile option")
    first_jit = False if False in jit_options else jit_options[0]
    baseline = ("float32" if "float32" in precisions else precisions[0], first_jit)
    s = _Search(measure, baseline, len(precisions) + len(jit_options) - 1, budget_seconds,
                steps_per_epoch, clock)
    first, cost = {}, {}  # the fastest first step (after tracing); what each call took

    def begin(key):
        if key != baseline and not s.affordable(key, cost[baseline, FIRST]):
            return
        # The baseline takes one step more, for a steadier reference; a setting just over the
        # limit two more (one hiccup must not drop it), one far over the limit none.
        times = s.run(key, FIRST, first_steps + (key == baseline))
        first[key], cost[key, FIRST] = min(times[1:] or times), s.rows[key]["last"]
        ratio = first[key] / first[baseline]
        if key != baseline and first_step_slower_than < ratio <= 3 * first_step_slower_than:
            first[key] = min(first[key], *s.run(key, FIRST, 2))
            cost[key, FIRST] += s.rows[key]["last"]
            ratio = first[key] / first[baseline]
        if key != baseline and ratio > first_step_slower_than:
            return s.end(key, DROPPED, f"first steps {ratio:.0f}x slower than {baseline[0]}"
                         f"{' with XLA' if baseline[1] else ''}'s (limit "
                         f"{first_step_slower_than:g}x): no full-batch step")
        # The baseline's warm-up, scaled by how much longer this setting's first steps took
        # (tracing, XLA compilation and steps alike), is what this one's will take.
        expected = cost[baseline, WARMUP] * cost[key, FIRST] / cost[baseline, FIRST] \
            if key != baseline else 0.0
        if key != baseline and expected > s.left(key):
            return s.end(key, BUDGET_SPENT, f"{max(s.left(key), 0):.1f} s of its share left, "
                         f"its full-batch warm-up would take about {expected:.1f} s")
        # The baseline always takes its full warm-up: the budget (a tenth of an epoch) and
        # every ratio come from its step time, which must not be the traced first step's.
        times = s.run(key, WARMUP, max(warmup, 2) if key == baseline else warmup,
                      bounded=key != baseline)
        s.rows[key]["pace"], cost[key, WARMUP] = times[-1], s.rows[key]["last"]
        if key == baseline:  # the fallback must have a timing, even out of budget
            s.rows[key]["timing"] = min(times[1:] or times)
            if s.spent() >= s.total():
                s.rows[key]["note"] = (f"its first steps and warm-up took {s.spent():.1f} s, "
                                       f"over the trials' whole {s.total():.0f} s budget: "
                                       "no other setting tried")

    def take_turns(keys):
        for r in range(rounds):
            live = s.live(keys)
            if not live:
                return
            pace = {k: s.rows[k]["timing"] or s.rows[k]["pace"] for k in live}
            cap = drop_slower_than * steps * min(pace.values())
            for key in live:
                n = max(1, min(steps, int(cap / pace[key])))
                n = int(min(n, s.left(key) / pace[key] - 1))  # what is left of its share
                if n < 1:
                    done = s.rows[key]["rounds"]
                    s.end(key, BUDGET_SPENT, f"its {s.rows[key]['seconds']:.1f} s share spent "
                          + (f"after {done} round(s)" if done else "before a timed round"))
                    continue
                # A fit call's first step is slower: one warm-up step.
                times = monitor.StepTimes.split(s.run(key, ROUND, 1 + n), warmup=1)
                if times.seconds:
                    row = s.rows[key]
                    seconds = times.median
                    row["timing"] = min(row["timing"] or seconds, seconds)
                    row["rounds"] += 1
            timed_keys = [k for k in s.live(keys) if s.rows[k]["timing"]]
            fastest = min((s.rows[k]["timing"] for k in timed_keys), default=None)
            for key in timed_keys:
                ratio = s.rows[key]["timing"] / fastest
                if ratio > drop_slower_than:
                    s.end(key, DROPPED, f"{ratio:.1f}x slower than the fastest after round "
                          f"{r + 1} (limit {drop_slower_than:g}x)")

    try:
        stage1 = [(p, first_jit) for p in sorted(precisions, key=lambda p: p != baseline[0])]
        for key in stage1:
            begin(key)
        take_turns(stage1)
        timings = {k: r["timing"] for k, r in s.rows.items() if r["timing"]}
        best_precision = choose_fastest(timings, baseline, min_speedup)[0]
        for key in [k for k in stage1 if k[0] != best_precision and k != baseline]:
            getattr(measure, "release", lambda key: None)(key)
        stage2 = [(best_precision, jit) for jit in jit_options]
        if len(stage2) > 1:
            for key in stage2:
                if key not in s.rows:
                    begin(key)
                elif s.rows[key]["status"] == MEASURED:
                    s.rows[key]["status"] = None
            take_turns(stage2)
    finally:
        getattr(measure, "release", lambda key: None)(None)
    timings = {k: r["timing"] for k, r in s.rows.items() if r["timing"]}
    chosen = choose_fastest(timings, baseline, min_speedup)
    table = []
    for key, r in s.rows.items():
        row = {"precision": key[0], "jit_compile": key[1], "status": r["status"] or MEASURED}
        if r["timing"]:
            row["ms_per_step"] = 1000 * r["timing"]
            if batch_size:
                row["examples_per_sec"] = batch_size / r["timing"]
            row["speedup"] = timings[baseline] / r["timing"]
        notes = [r["note"]] + ((advice(key[0]) or [""])[:1] if advice and key != chosen else [])
        table.append(dict(row, rounds=r["rounds"], seconds=r["seconds"],
                          note="; ".join(n for n in notes if n)))
    return AutoChoice(precision=chosen[0], jit_compile=chosen[1], table=tuple(table),
                      seconds=clock() - s.start, budget_seconds=s.total())


class _CopyTrials:
    """`measure` for `search_settings`: one copy of `model` per setting, trained on `dataset`."""

    def __init__(self, model, dataset, compile_fn, first_batch):
        self.model, self.dataset, self.compile_fn = model, dataset, compile_fn
        self.small = dataset.unbatch().batch(first_batch, drop_remainder=True)
        self.copies = {}

    def __call__(self, key, kind, steps, deadline):
        if key not in self.copies:  # same weights; `model` itself is untouched
            self.copies[key] = precision.apply_precision(self.model, key[0], copy=True)
            self.compile_fn(self.copies[key], *key)
        data = self.small if kind == FIRST else self.dataset
        return monitor.time_fit(self.copies[key], data, steps, deadline=deadline).seconds

    def release(self, key):
        """Forgets the copy of `key` (None: all of them, and frees Keras's memory)."""
        if key is None:
            self.copies.clear()
            memory.free_memory()
        else:
            self.copies.pop(key, None)


def auto_select(model, dataset, batch_size, precisions=PRECISIONS, jit_options=(False, True),
                compile_fn=None, budget_seconds=batch_search.DEFAULT, steps_per_epoch=None,
                batch_multiple=1, gpus=None, cpu_flags=None, **search):
    """Times precision and XLA settings on `model` and `dataset`, and keeps the fastest.

    Each setting trains its own copy of `model` (same weights; `model` is
    untouched); see `search_settings` for the search, its budget and its
    rules. The global policy is restored.

    Example:

        choice = auto_select(model, train_ds, batch_size=64, steps_per_epoch=100)
        print(choice.precision, choice.jit_compile)

    Args:
      model: a built Functional or Sequential tf_keras model.
      dataset: the batched training dataset.
      batch_size: its global batch size (for examples/s).
      precisions: candidate precisions, e.g. `PRECISIONS` or ('mixed_float16',).
      jit_options: candidate XLA settings, e.g. (False, True) or (False,).
      compile_fn: `fn(model, precision, jit_compile)` compiling a copy as training
        will (default: classifier loss, Adam, loss scaling for float16).
      budget_seconds, steps_per_epoch: the time budget (see `search_settings`).
      batch_multiple: the first steps' small batch (`batch_search.first_step_batch`) is a
        multiple of this (replicas x gradient accumulation steps).
      gpus, cpu_flags: the hardware `precision_advice` describes in the notes
        of the settings that lost (default: this machine's).
      **search: `warmup`, `steps`, `rounds`, `drop_slower_than`, `first_steps`,
        `first_step_slower_than`, `min_speedup` of `search_settings`.

    Returns:
      An `AutoChoice` whose table lists every setting tried, and why any was dropped.
    """
    trials = _CopyTrials(model, dataset, compile_fn or default_compile,
                         batch_search.first_step_batch(batch_size, batch_multiple))
    return search_settings(
        trials, precisions, jit_options, batch_size, budget_seconds=budget_seconds,
        steps_per_epoch=steps_per_epoch, **search,
        advice=lambda name: precision.precision_advice(name, gpus, cpu_flags))
