"""Timing `fit` with and without the recipes' callbacks: the machinery bench_overhead.py and
bench_lm.py share.

A run's epochs are timed between two epoch ends by `EpochClock` (last in the callback list,
so every other callback's epoch-end work counts); the first epoch (tracing) is left out
(`steady_epochs`). `time_hooks` wraps each hook a callback overrides, so that its own time
per epoch is known (`per_epoch`); `unwrap_hooks` undoes it. `alternate` runs the two sides
in the order bare, recipe, recipe, bare, ... so that a load on the machine falls on both
alike, and `round_ratios` pairs them round by round.
"""

import statistics
import time

HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
         "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end",
         "on_test_batch_begin", "on_test_batch_end")


def epoch_clock():
    """A callback (last in the list) keeping `marks`, the start and each epoch end's time, and
    `test_marks`, when each epoch's validation began (so that `steady_training` is the
    epochs' training part: from the previous epoch's end to the validation)."""
    from tfaccel.keras import keras

    class EpochClock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.marks, self.test_marks = [time.perf_counter()], []

        def on_test_begin(self, logs=None):
            self.test_marks.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            self.marks.append(time.perf_counter())

    return EpochClock()


def steady_training(clock):
    """Seconds of each epoch's training part after the first (needs validation each epoch)."""
    return [t - m for m, t in zip(clock.marks[1:], clock.test_marks[1:])]


def time_hooks(callbacks, calls, clock=time.perf_counter):
    """Wraps each hook a callback overrides so that its calls land in `calls[name]` as
    (start, seconds). Hooks a callback leaves to `Callback` stay unwrapped: Keras decides
    from them which hooks to call at all, and that must not change."""
    from tfaccel.keras import keras

    for callback in callbacks:
        name = type(callback).__name__
        for hook in HOOKS:
            if getattr(type(callback), hook) is getattr(keras.callbacks.Callback, hook):
                continue

            def timed(*args, _inner=getattr(callback, hook), _calls=calls.setdefault(name, []),
                      **kwargs):
                start = clock()
                try:
                    return _inner(*args, **kwargs)
                finally:
                    _calls.append((start, clock() - start))

            setattr(callback, hook, timed)


def unwrap_hooks(callbacks):
    """Undoes `time_hooks` (for a callback that serves several runs)."""
    for callback in callbacks:
        for hook in HOOKS:
            vars(callback).pop(hook, None)


def steady_epochs(marks):
    """Seconds of each epoch after the first, from the epoch-end times (`marks[0]`: start)."""
    return [b - a for a, b in zip(marks[1:], marks[2:])]


def per_epoch(calls, marks):
    """Each callback's hook seconds in each steady epoch (between two epoch ends)."""
    windows = list(zip(marks[1:], marks[2:]))
    return [sum(s for start, s in calls if lo < start <= hi) for lo, hi in windows]


def alternate(rounds, run, printer=print):
    """[{'round', 'side', **run(side)}] for `rounds` rounds of the sides 'bare' and 'recipe',
    alternating which goes first; `run(side)` returns at least {'epoch_seconds': [...]}."""
    runs = []
    for r in range(rounds):
        for side in (("bare", "recipe") if r % 2 == 0 else ("recipe", "bare")):
            runs.append({"round": r, "side": side, **run(side)})
            epochs = runs[-1]["epoch_seconds"]
            printer(f"round {r + 1}/{rounds} {side:6s}: steady epoch median "
                    f"{1000 * statistics.median(epochs):8.1f} ms, mean "
                    f"{1000 * statistics.fmean(epochs):8.1f} ms")
    return runs


def epochs_of(runs, side):
    """Every steady epoch's seconds of `side`'s runs."""
    return [s for run in runs if run["side"] == side for s in run["epoch_seconds"]]


def round_ratios(runs):
    """Per round, the recipe's median steady epoch over the bare one's."""
    ratios = []
    for r in sorted({run["round"] for run in runs}):
        side = {run["side"]: run["epoch_seconds"] for run in runs if run["round"] == r}
        ratios.append(statistics.median(side["recipe"]) / statistics.median(side["bare"]))
    return ratios
