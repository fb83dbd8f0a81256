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
import _fit_timing as timing
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


def main(argv):
    del argv  # stray arguments were rejected with the flags
    from tfaccel import doctor, plots, summaries
    from tfaccel.errors import ConfigError
    from tfaccel.keras import keras
    from tfaccel.train import precision, resume

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

    def build():
        keras.utils.set_random_seed(FLAGS.seed)
        with strategy.scope():
            model = precision.apply_precision(common.load_model(splits.info), policy)
            schedule = common.lr_schedule(learning_rate, inputs.steps_per_epoch)
            common.compile_from_flags(model, schedule, policy, jit_compile,
                                      FLAGS.grad_accum_steps)
        return model

    def recipe_callbacks(run_dir):
        return common.fit_callbacks(run_dir, os.path.join(run_dir, "logs"),
                                    os.path.join(run_dir, "backup"), FLAGS.backup_freq,
                                    data_epoch, printer=lambda line: None).callbacks

    def fit(model, callbacks, verbose):
        return model.fit(inputs.train, validation_data=inputs.validation, epochs=FLAGS.epochs,
                         callbacks=callbacks, verbose=verbose)

    with open(os.path.join(FLAGS.output_dir, "fit.log"), "w") as log:
        runs = timing.alternate(
            FLAGS.rounds,
            lambda side: timing.run_side(side, build, recipe_callbacks, fit, FLAGS.output_dir,
                                         log)[0],
            printer=lambda line: print(line, flush=True))

    bare, recipe = timing.steady(runs, "bare"), timing.steady(runs, "recipe")
    ratio, mean_ratio = recipe.median / bare.median, recipe.mean / bare.mean
    round_ratios = timing.round_ratios(runs)
    callbacks = [{"callback": name, "median_ms": 1000 * cost.median, "mean_ms": 1000 * cost.mean,
                  "max_ms": 1000 * max(cost.seconds),
                  "mean_share_of_bare_epoch": cost.mean / bare.median}
                 for name, cost in timing.callback_costs(runs).items()]
    kind = "long" if bare.median >= LONG_EPOCH_SECONDS else "short"
    target = TARGETS[kind]
    met = ratio <= target

    label = (f"{common.model_label()} on {FLAGS.dataset}, batch {FLAGS.batch_size}, "
             f"{FLAGS.epochs} epochs x {FLAGS.rounds} rounds")
    rows = [{"what": "bare fit (validation, no callbacks)", "median_ms": 1000 * bare.median,
             "mean_ms": 1000 * bare.mean},
            {"what": "recipe (its default callbacks)", "median_ms": 1000 * recipe.median,
             "mean_ms": 1000 * recipe.mean}]
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

    png = plots.plot_rates([r["what"].strip() for r in rows],
                           [max(1.0, 1000 * r["median_ms"]) for r in rows],
                           os.path.join(FLAGS.output_dir, "bench_overhead.png"),
                           "microseconds per steady epoch, median (log scale)",
                           f"{label}: recipe / bare = {ratio:.3f}", log_scale=True)
    _cli.write_outputs("bench_overhead", {
        "config": {"model": common.model_label(), "dataset": FLAGS.dataset,
                   "synthetic_shape": FLAGS.synthetic_shape, "batch_size": FLAGS.batch_size,
                   "epochs": FLAGS.epochs, "rounds": FLAGS.rounds,
                   "backup_freq": FLAGS.backup_freq, "precision": policy,
                   "monitor_every_n_steps": FLAGS.monitor_every_n_steps, "machine": machine},
        "bare_median_seconds": bare.median, "recipe_median_seconds": recipe.median,
        "ratio": ratio, "mean_ratio": mean_ratio, "round_ratios": round_ratios,
        "callbacks": callbacks, "target": {"kind": kind, "max_ratio": target, "met": met},
        "runs": runs}, f"{label}\n\n{machine}\n\n{table}\n\n{verdict}", png, also=["fit.log"])
    return 0 if met else 1


if __name__ == "__main__":
    _cli.run(main)
