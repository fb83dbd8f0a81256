"""The language-model recipe's training tokens/s against a bare `fit`, interleaved in one run.

    python benchmarks/bench_lm.py                      # tiny GPT, the recipe's defaults
    python benchmarks/bench_lm.py --gpt_size=small --sequence_length=128 --epochs=2

Both sides train the same decoder (built afresh for every run with the same seed) on the
same windows of the same text (recipes/lm_common.py, as recipes/train_lm.py builds them),
--epochs epochs of --steps_per_epoch steps, with validation after each. A "recipe" run adds
exactly the callbacks train_lm.py runs (`common.fit_callbacks` with the language-model
metrics and the per-epoch sample) and its `verbose=2`; a "bare" run adds none. Runs
alternate (bare, recipe, recipe, bare, ...) for --rounds rounds. Training tokens/s of a
side is steps x batch x sequence length over its median steady epoch's training part (from
the previous epoch's end to the start of validation: the steps and every callback's
per-step and epoch-begin work; the first epoch, tracing, left out); the whole epochs' rate
(with validation and the recipe's sample) is printed beside it.

It prints both sides' tokens/s and their ratio recipe / bare (per round too), each
callback's own time per epoch, the recipe's validation loss and fit time (with the defaults:
the tiny GPT's 2,000 steps of batch 12), and writes bench_lm.json, bench_lm.png and the
table as TensorBoard text to --output_dir. Target (issue #15): training tokens/s ratio
>= 0.95. Exit status 1 when it is missed.
"""

import os

import _cli
import _fit_timing as timing
import common
import lm_common
from absl import flags

FLAGS = flags.FLAGS
lm_common.define_flags()
flags.DEFINE_integer("rounds", 1, "Rounds of one bare and one recipe run (order alternating).",
                     lower_bound=1)
_cli.define_output_dir("runs/bench_lm", "Where bench_lm.json, the chart and TensorBoard logs "
                       "go.")

TARGET = 0.95  # recipe tokens/s over bare tokens/s, at least


def main(argv):
    del argv  # stray arguments were rejected with the flags
    import statistics

    from tfaccel import doctor, plots, summaries
    from tfaccel.keras import keras
    from tfaccel.performance import utilization
    from tfaccel.train import language_model, precision, resume

    length = lm_common.sequence_length()
    resume.parse_backup_freq(FLAGS.backup_freq)
    policy = precision.check_precision(FLAGS.precision)
    jit_compile = precision.parse_jit_compile(FLAGS.jit_compile)
    strategy = common.strategy_from_flags()
    learning_rate = common.scaled_learning_rate(FLAGS.learning_rate, strategy)
    splits = lm_common.load_text(length)
    unit = language_model.UNITS[FLAGS.tokenizer]
    precision.set_precision(policy)
    data_epoch = resume.EpochCounter()  # one pipeline for both sides, as the recipe builds it
    inputs = lm_common.lm_inputs(splits, length, strategy, epoch=data_epoch.epoch)
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    tokens_per_epoch = FLAGS.steps_per_epoch * FLAGS.batch_size * length

    def build():
        keras.utils.set_random_seed(FLAGS.seed)
        with strategy.scope():
            model = lm_common.build_language_model(splits.vocab.size)
            schedule = common.lr_schedule(learning_rate, inputs.steps_per_epoch)
            lm_common.compile_from_flags(model, schedule, policy, jit_compile,
                                         FLAGS.grad_accum_steps)
        return model

    def recipe_callbacks(run_dir):
        train_logdir = os.path.join(run_dir, "logs", "train")
        extra = [language_model.LanguageModelMetrics(length, unit)]
        if FLAGS.sample_tokens:
            extra.append(language_model.SampleLogger(
                train_logdir, splits.vocab, FLAGS.prompt, FLAGS.sample_tokens, seed=FLAGS.seed,
                printer=None))
        return common.fit_callbacks(run_dir, os.path.join(run_dir, "logs"),
                                    os.path.join(run_dir, "backup"), FLAGS.backup_freq,
                                    data_epoch, printer=lambda line: None, extra=extra).callbacks

    def fit(model, callbacks, verbose):
        return model.fit(inputs.train, validation_data=inputs.validation, epochs=FLAGS.epochs,
                         steps_per_epoch=inputs.steps_per_epoch, callbacks=callbacks,
                         verbose=verbose)

    def run(side, log):
        measured, history = timing.run_side(side, build, recipe_callbacks, fit,
                                            FLAGS.output_dir, log)
        return dict(measured, val_loss=float(history.history["val_loss"][-1]))

    with open(os.path.join(FLAGS.output_dir, "fit.log"), "w") as log:
        runs = timing.alternate(FLAGS.rounds, lambda side: run(side, log),
                                printer=lambda line: print(line, flush=True))

    flops_per_token = utilization.training_flops_per_example(
        build(), sequence_length=length) / length  # the traced step's own count
    peak = doctor.peak(policy)
    train = {side: timing.steady(runs, side, "train_seconds") for side in ("bare", "recipe")}
    epochs = {side: timing.steady(runs, side) for side in ("bare", "recipe")}
    rates = {side: train[side].rate(tokens_per_epoch) for side in train}
    wall = {side: epochs[side].rate(tokens_per_epoch) for side in epochs}
    ratio, wall_ratio = rates["recipe"] / rates["bare"], wall["recipe"] / wall["bare"]
    per_round = [1 / r for r in timing.round_ratios(runs, "train_seconds")]  # of tokens/s
    recipe_runs = [run_ for run_ in runs if run_["side"] == "recipe"]
    val_loss = statistics.median(run_["val_loss"] for run_ in recipe_runs)
    fit_seconds = max(run_["fit_seconds"] for run_ in recipe_runs)
    met = ratio >= TARGET
    mfu = {side: utilization.mfu(rates[side], flops_per_token, peak) for side in rates}
    rows = [{"what": "bare fit (validation, no callbacks)", "train_tokens_per_sec": rates["bare"],
             "mfu": mfu["bare"], "epoch_tokens_per_sec": wall["bare"],
             "median_epoch_ms": 1000 * epochs["bare"].median},
            {"what": "recipe (train_lm.py's callbacks)", "train_tokens_per_sec": rates["recipe"],
             "mfu": mfu["recipe"], "epoch_tokens_per_sec": wall["recipe"],
             "median_epoch_ms": 1000 * epochs["recipe"].median}]
    rows += [{"what": f"  {name}", "median_epoch_ms": 1000 * cost.median}
             for name, cost in timing.callback_costs(runs).items()]
    table = summaries.markdown_table(rows, ["what", "train_tokens_per_sec", "mfu",
                                            "epoch_tokens_per_sec", "median_epoch_ms"])
    label = (f"GPT {FLAGS.gpt_size} on {splits.source}, batch {FLAGS.batch_size} x {length} "
             f"tokens, {FLAGS.epochs} epochs of {FLAGS.steps_per_epoch} steps x {FLAGS.rounds} "
             f"rounds, {policy}")
    machine = doctor.machine_summary()
    verdict = (f"{'PASS' if met else 'FAIL'}  training tokens/s recipe/bare {ratio:.3f} "
               f"(target >= {TARGET:.2f}; per round " + ", ".join(f"{x:.3f}" for x in per_round)
               + f"); whole epochs (validation, the recipe's sample) {wall_ratio:.3f}\n"
               f"recipe: validation loss {val_loss:.4f} nats/{unit} after "
               f"{FLAGS.epochs * FLAGS.steps_per_epoch} steps, fit {fit_seconds:.1f} s")
    utilization_line = (f"model FLOPs: {flops_per_token / 1e6:.2f} MFLOP per token (traced step); "
                        f"peak {peak.flops_per_second / 1e9:,.0f} GFLOP/s = {peak.how}")
    print(f"\n{label}\nmachine: {machine}\n{utilization_line}\n"
          f"per steady epoch (hook time of each callback):\n{table}\n\n{verdict}")

    png = plots.plot_rates(["bare fit: training", "recipe: training", "bare fit: whole epochs",
                            "recipe: whole epochs"],
                           [rates["bare"], rates["recipe"], wall["bare"], wall["recipe"]],
                           os.path.join(FLAGS.output_dir, "bench_lm.png"),
                           "tokens/s (median steady epoch)",
                           f"{label}: recipe / bare = {ratio:.3f}")
    _cli.write_outputs("bench_lm", {
        "config": {"gpt_size": FLAGS.gpt_size, "sequence_length": length,
                   "batch_size": FLAGS.batch_size, "epochs": FLAGS.epochs,
                   "steps_per_epoch": FLAGS.steps_per_epoch, "rounds": FLAGS.rounds,
                   "precision": policy, "machine": machine},
        "tokens_per_sec": rates, "mfu": mfu, "flops_per_token": flops_per_token,
        "peak": {"flops_per_second": peak.flops_per_second, "how": peak.how},
        "epoch_tokens_per_sec": wall, "ratio": ratio,
        "epoch_ratio": wall_ratio, "round_ratios": per_round, "validation_loss": val_loss,
        "recipe_fit_seconds": fit_seconds, "target": {"min_ratio": TARGET, "met": met},
        "runs": runs}, f"{label}\n\n{machine}\n\n{utilization_line}\n\n{table}\n\n{verdict}",
        png, also=["fit.log"])
    return 0 if met else 1


if __name__ == "__main__":
    _cli.run(main)
