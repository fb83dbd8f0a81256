"""The train recipe's overhead: its default callbacks against a bare `fit`, interleaved in one run.

    python benchmarks/bench_overhead.py                    # digits CNN, batch 64, validation
    python benchmarks/bench_overhead.py --dataset=synthetic --synthetic_shape=32,32,3 \\
        --synthetic_examples=16384 --epochs=5 --rounds=2   # epochs of >= 2 s

Both sides train the same model (built afresh for every run, with the same seed) on the
same batches (the recipe's input pipeline, `common.input_from_flags`), with validation,
for --epochs epochs per run. A "recipe" run adds exactly the callbacks recipes/train.py
runs (`common.fit_callbacks`, the one function both use, under the same flags and
defaults: --backup_freq, --monitor_every_n_steps, ...) and its `verbose=2`; a "bare" run
adds none. Runs alternate (bare, recipe, recipe, bare, ...) for --rounds rounds, so that
a load on the machine falls on both sides alike. An epoch's time is the time between two
epoch ends (everything in `fit`'s loop counts); the first epoch of each run (tracing) is
left out.

It prints the steady epoch-time ratio recipe / bare (medians of the epochs; the ratio of
the means too, which counts the occasional backup) and each callback's own time per
epoch (its hooks timed), and writes bench_overhead.json, bench_overhead.png and the table
as TensorBoard text to --output_dir. Targets (issue #13): ratio <= 1.10, and <= 1.03
when the bare epochs take >= 2 s. Exit status 1 when the target is missed.
"""

import os

import _cli
import common
from absl import flags

FLAGS = flags.FLAGS
common.define_data_flags()
common.define_model_flags()
common.define_train_flags(epochs=10)
common.define_distribute_flags()
common.define_backup_flags(default_freq=common.TRAIN_BACKUP_FREQ)
common.define_pipeline_flags()
common.define_schedule_flags()
common.define_performance_flags()
flags.DEFINE_integer("rounds", 3, "Rounds of one bare and one recipe run (order alternating).",
                     lower_bound=1)
_cli.define_output_dir("runs/bench_overhead", "Where bench_overhead.json, the chart and "
                       "TensorBoard logs go.")

LONG_EPOCH_SECONDS = 2.0  # bare epochs at least this long have the tighter target
TARGETS = {"short": 1.10, "long": 1.03}
_HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
          "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end",
          "on_test_batch_begin", "on_test_batch_end")


def _time_hooks(callbacks, calls, clock):
    """Wraps each hook a callback overrides so that its calls land in `calls[name]` as
    (start, seconds). Hooks a callback leaves to `Callback` stay unwrapped: Keras decides
    from them which hooks to call at all, and that must not change."""
    from tfaccel.keras import keras

    for callback in callbacks:
        name = type(callback).__name__
        for hook in _HOOKS:
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


def _steady_epochs(marks):
    """Seconds of each epoch after the first, from the epoch-end times (`marks[0]`: start)."""
    return [b - a for a, b in zip(marks[1:], marks[2:])]


def _per_epoch(calls, marks):
    """Each callback's hook seconds in each steady epoch (between two epoch ends)."""
    windows = list(zip(marks[1:], marks[2:]))
    return [sum(s for start, s in calls if lo < start <= hi) for lo, hi in windows]


def main(argv):
    del argv  # stray arguments were rejected with the flags
    import contextlib
    import shutil
    import statistics
    import tempfile
    import time

    from tfaccel import doctor, io, plots, summaries
    from tfaccel.errors import ConfigError
    from tfaccel.keras import keras
    from tfaccel.performance import memory, precision
    from tfaccel.train import resume

    resume.parse_backup_freq(FLAGS.backup_freq)
    policy = precision.check_precision(FLAGS.precision)
    jit_compile = precision.parse_jit_compile(FLAGS.jit_compile)
    if jit_compile == "auto":
        raise ConfigError("--jit_compile=auto runs timed trials: pass true or false to time "
                          "the recipe's callbacks")
    strategy = common.strategy_from_flags()
    learning_rate = common.scaled_learning_rate(FLAGS.learning_rate, strategy)
    splits = common.load_data()
    precision.set_precision(policy)
    data_epoch = resume.EpochCounter()  # one pipeline for both sides, as the recipe builds it
    inputs = common.input_from_flags(splits, strategy, epoch=data_epoch.epoch)
    os.makedirs(FLAGS.output_dir, exist_ok=True)

    class EpochClock(keras.callbacks.Callback):
        """Last in the list: the time of each epoch end, after every other callback's."""

        def on_train_begin(self, logs=None):
            self.marks = [time.perf_counter()]

        def on_epoch_end(self, epoch, logs=None):
            self.marks.append(time.perf_counter())

    def build():
        keras.utils.set_random_seed(FLAGS.seed)
        with strategy.scope():
            model = precision.apply_precision(common.load_model(splits.info), policy)
            schedule = common.lr_schedule(learning_rate, inputs.steps_per_epoch)
            common.compile_from_flags(model, schedule, policy, jit_compile,
                                      FLAGS.grad_accum_steps)
        return model

    def run(side, log):
        model, clock, calls, callbacks = build(), EpochClock(), {}, []
        run_dir = tempfile.mkdtemp(prefix=f"{side}-", dir=FLAGS.output_dir)
        try:
            if side == "bare":
                callbacks, verbose = [], 0
            else:
                fit = common.fit_callbacks(run_dir, os.path.join(run_dir, "logs"),
                                           os.path.join(run_dir, "backup"), FLAGS.backup_freq,
                                           data_epoch, printer=lambda line: None)
                callbacks, verbose = fit.callbacks, 2
                _time_hooks(callbacks, calls, time.perf_counter)
            with contextlib.redirect_stdout(log):  # the recipe's per-epoch lines, to fit.log
                model.fit(inputs.train, validation_data=inputs.validation, epochs=FLAGS.epochs,
                          callbacks=[*callbacks, clock], verbose=verbose)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
            for callback in callbacks:  # data_epoch serves every run: unwrap its hooks
                for hook in _HOOKS:
                    vars(callback).pop(hook, None)
        del model
        memory.free_memory()
        return {"epoch_seconds": _steady_epochs(clock.marks),
                "callback_seconds": {name: _per_epoch(c, clock.marks)
                                     for name, c in calls.items()}}

    runs = []
    with open(os.path.join(FLAGS.output_dir, "fit.log"), "w") as log:
        for r in range(FLAGS.rounds):
            for side in (("bare", "recipe") if r % 2 == 0 else ("recipe", "bare")):
                runs.append({"round": r, "side": side, **run(side, log)})
                epochs = runs[-1]["epoch_seconds"]
                print(f"round {r + 1}/{FLAGS.rounds} {side:6s}: steady epoch median "
                      f"{1000 * statistics.median(epochs):8.1f} ms, mean "
                      f"{1000 * statistics.fmean(epochs):8.1f} ms", flush=True)

    def epochs_of(side):
        return [s for run_ in runs if run_["side"] == side for s in run_["epoch_seconds"]]

    bare, recipe = epochs_of("bare"), epochs_of("recipe")
    bare_median = statistics.median(bare)
    ratio = statistics.median(recipe) / bare_median
    mean_ratio = statistics.fmean(recipe) / statistics.fmean(bare)
    round_ratios = []
    for r in range(FLAGS.rounds):
        side = {run_["side"]: run_["epoch_seconds"] for run_ in runs if run_["round"] == r}
        round_ratios.append(statistics.median(side["recipe"]) / statistics.median(side["bare"]))
    costs = {}
    for run_ in runs:
        for name, seconds in run_["callback_seconds"].items():
            costs.setdefault(name, []).extend(seconds)
    callbacks = [{"callback": name, "median_ms": 1000 * statistics.median(s),
                  "mean_ms": 1000 * statistics.fmean(s), "max_ms": 1000 * max(s),
                  "mean_share_of_bare_epoch": statistics.fmean(s) / bare_median}
                 for name, s in costs.items()]
    kind = "long" if bare_median >= LONG_EPOCH_SECONDS else "short"
    target = TARGETS[kind]
    met = ratio <= target

    label = (f"{common.model_label()} on {FLAGS.dataset}, batch {FLAGS.batch_size}, "
             f"{FLAGS.epochs} epochs x {FLAGS.rounds} rounds")
    rows = [{"what": "bare fit (validation, no callbacks)", "median_ms": 1000 * bare_median,
             "mean_ms": 1000 * statistics.fmean(bare)},
            {"what": "recipe (its default callbacks)",
             "median_ms": 1000 * statistics.median(recipe),
             "mean_ms": 1000 * statistics.fmean(recipe)}]
    rows += [{"what": f"  {c['callback']}", "median_ms": c["median_ms"], "mean_ms": c["mean_ms"],
              "max_ms": c["max_ms"]} for c in callbacks]
    table = summaries.markdown_table(rows, ["what", "median_ms", "mean_ms", "max_ms"])
    machine = doctor.machine_summary()
    verdict = (f"{'PASS' if met else 'FAIL'}  steady epoch ratio recipe/bare {ratio:.3f} "
               f"(target <= {target:.2f}, bare epochs {'>=' if kind == 'long' else '<'} "
               f"{LONG_EPOCH_SECONDS:g} s); ratio of means {mean_ratio:.3f}; per round "
               + ", ".join(f"{x:.3f}" for x in round_ratios))
    print(f"\n{label}\nmachine: {machine}\nper steady epoch (hook time of each callback):\n"
          f"{table}\n\n{verdict}")

    logdir = os.path.join(FLAGS.output_dir, "logs")
    summaries.write_text(logdir, "bench/overhead", f"{label}\n\n{machine}\n\n{table}\n\n{verdict}")
    png = os.path.join(FLAGS.output_dir, "bench_overhead.png")
    plots.plot_rates([r["what"].strip() for r in rows],
                     [max(1.0, 1000 * r["median_ms"]) for r in rows], png,
                     "microseconds per steady epoch, median (log scale)",
                     f"{label}: recipe / bare = {ratio:.3f}", log_scale=True)
    summaries.write_png(logdir, "bench/overhead_plot", png)
    io.write_json(os.path.join(FLAGS.output_dir, "bench_overhead.json"), {
        "config": {"model": common.model_label(), "dataset": FLAGS.dataset,
                   "synthetic_shape": FLAGS.synthetic_shape, "batch_size": FLAGS.batch_size,
                   "epochs": FLAGS.epochs, "rounds": FLAGS.rounds,
                   "backup_freq": FLAGS.backup_freq, "precision": policy,
                   "monitor_every_n_steps": FLAGS.monitor_every_n_steps, "machine": machine},
        "bare_median_seconds": bare_median, "recipe_median_seconds": statistics.median(recipe),
        "ratio": ratio, "mean_ratio": mean_ratio, "round_ratios": round_ratios,
        "callbacks": callbacks, "target": {"kind": kind, "max_ratio": target, "met": met},
        "runs": runs})
    print(f"\nwrote {FLAGS.output_dir}: bench_overhead.json, bench_overhead.png, fit.log, logs/")
    return 0 if met else 1


if __name__ == "__main__":
    _cli.run(main)
