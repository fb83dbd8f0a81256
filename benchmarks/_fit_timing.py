"""Timing `fit` with and without the recipes' callbacks: the machinery bench_overhead.py and
bench_lm.py share, on tfaccel's one step timer (`tfaccel.monitor.StepClock`).

`run_side` trains a fresh model once as one side: "bare" (no callback, verbose 0) or
"recipe" (the recipe's callbacks, verbose 2, in a temporary run folder removed afterwards).
Its epochs are timed by `epoch_clock` (last in the callback list, so every other callback's
epoch-end work counts): each epoch from one epoch end to the next, and its training part
(from the previous epoch's end to its validation), the first epoch (tracing) being the
clock's warm-up. `time_hooks` times each hook a recipe callback overrides, so that its own
time per steady epoch is known. `alternate` runs the two sides in the order bare, recipe,
recipe, bare, ... so that a load on the machine falls on both alike; `steady` gathers a
side's steady epochs as `StepTimes` (`callback_costs` each callback's), and `round_ratios`
pairs the sides round by round.
"""

import contextlib
import shutil
import tempfile

HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
         "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end",
         "on_test_batch_begin", "on_test_batch_end")


def epoch_clock(hooks=None):
    """A callback (last in the list) with two `StepClock`s whose steps are epochs, the first
    one their warm-up: `epochs` (from one epoch end to the next) and `training` (from the
    previous epoch's end to this one's validation: needs validation each epoch), and
    `hook_seconds()`: {callback: its hooks' seconds in each steady epoch} of the clocks
    `time_hooks` put in `hooks`."""
    from tfaccel import monitor
    from tfaccel.keras import keras

    class EpochClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs, self.training = monitor.StepClock(warmup=1), monitor.StepClock(warmup=1)
            self.hooks, self.hook_totals = {} if hooks is None else hooks, []

        def on_train_begin(self, logs=None):
            self.epochs.start()
            self.training.start()

        def on_test_begin(self, logs=None):
            if self.training.running:
                self.training.stop()

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.lap()
            self.training.start()
            self.hook_totals.append({name: sum(c.times().total for c in clocks)
                                     for name, clocks in self.hooks.items()})

        def hook_seconds(self):
            totals = self.hook_totals
            return {name: [b[name] - a[name] for a, b in zip(totals, totals[1:])]
                    for name in self.hooks}

    return EpochClock()


def time_hooks(callbacks, hooks):
    """Wraps each hook a callback overrides in a `StepClock` of its own, kept in
    `hooks[callback name]`. Hooks a callback leaves to `Callback` stay unwrapped: Keras decides
    from them which hooks to call at all, and that must not change."""
    from tfaccel import monitor
    from tfaccel.keras import keras

    for callback in callbacks:
        clocks = hooks.setdefault(type(callback).__name__, [])
        for hook in HOOKS:
            if getattr(type(callback), hook) is getattr(keras.callbacks.Callback, hook):
                continue
            clocks.append(monitor.StepClock())

            def timed(*args, _inner=getattr(callback, hook), _clock=clocks[-1], **kwargs):
                _clock.start()
                try:
                    return _inner(*args, **kwargs)
                finally:
                    _clock.stop()

            setattr(callback, hook, timed)


def unwrap_hooks(callbacks):
    """Undoes `time_hooks` (for a callback that serves several runs)."""
    for callback in callbacks:
        for hook in HOOKS:
            vars(callback).pop(hook, None)


def run_side(side, build, recipe_callbacks, fit, output_dir, log):
    """Trains `build()`'s model once as `side`, 'bare' or 'recipe'; what it measured.

    A recipe run's callbacks are `recipe_callbacks(run_dir)` (a temporary folder under
    `output_dir`), each hook timed. `fit(model, callbacks, verbose)` calls `model.fit` and
    returns its History; what it prints goes to `log`.

    Returns:
      ({'epoch_seconds', 'train_seconds' (steady epochs), 'fit_seconds' (all epochs),
      'callback_seconds'}, the History).
    """
    from tfaccel.performance import memory

    model, hooks, callbacks = build(), {}, []
    clock = epoch_clock(hooks)
    run_dir = tempfile.mkdtemp(prefix=f"{side}-", dir=output_dir)
    try:
        if side == "recipe":
            callbacks = recipe_callbacks(run_dir)
            time_hooks(callbacks, hooks)
        with contextlib.redirect_stdout(log):  # the recipe's per-epoch lines, to the log
            history = fit(model, [*callbacks, clock], 2 if side == "recipe" else 0)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
        unwrap_hooks(callbacks)  # a callback may serve every run (the data's epoch counter)
    del model
    memory.free_memory()
    epochs = clock.epochs.times()
    return {"epoch_seconds": list(epochs.seconds),
            "train_seconds": list(clock.training.times().seconds),
            "fit_seconds": epochs.total, "callback_seconds": clock.hook_seconds()}, history


def alternate(rounds, run, printer=print):
    """[{'round', 'side', **run(side)}] for `rounds` rounds of the sides 'bare' and 'recipe',
    alternating which goes first; `run(side)` returns at least {'epoch_seconds': [...]}."""
    runs = []
    for r in range(rounds):
        for side in (("bare", "recipe") if r % 2 == 0 else ("recipe", "bare")):
            runs.append({"round": r, "side": side, **run(side)})
            epochs = steady(runs[-1:], side)
            printer(f"round {r + 1}/{rounds} {side:6s}: steady epoch median "
                    f"{1000 * epochs.median:8.1f} ms, mean {1000 * epochs.mean:8.1f} ms")
    return runs


def steady(runs, side, key="epoch_seconds"):
    """`StepTimes` of every steady epoch (or its training part: `key='train_seconds'`) of
    `side`'s runs."""
    from tfaccel import monitor

    return monitor.StepTimes(tuple(s for run in runs if run["side"] == side for s in run[key]))


def callback_costs(runs):
    """{callback: `StepTimes` of its hooks' seconds in every steady epoch of every run}."""
    from tfaccel import monitor

    costs = {}
    for run in runs:
        for name, seconds in run["callback_seconds"].items():
            costs.setdefault(name, []).extend(seconds)
    return {name: monitor.StepTimes(tuple(seconds)) for name, seconds in costs.items()}


def round_ratios(runs, key="epoch_seconds"):
    """Per round, the recipe's median steady epoch (or training part) over the bare one's."""
    return [steady(same, "recipe", key).median / steady(same, "bare", key).median
            for same in ([run for run in runs if run["round"] == r]
                         for r in sorted({run["round"] for run in runs}))]
