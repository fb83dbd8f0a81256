"""The language-model recipe's training tokens/s against a bare `fit`, interleaved in one run.

    python benchmarks/bench_lm.py                      # tiny GPT, the recipe's defaults
    python benchmarks/bench_lm.py --gpt_size=small --sequence_length=128 --epochs=2
    python benchmarks/bench_lm.py --precision=float32 --jit_compile=false   # no trials

The settings are the recipe's: by default --precision=auto and --jit_compile=auto, so the
recipe's timed trials run first (their table is printed) and both sides train with what
they chose; a third side, "float32" (a bare fit in float32 without XLA, the setting the
trials must beat), shows what the choice gained (--nobaseline: left out).

Both sides train the same decoder (built afresh for every run with the same seed) on the
same windows of the same text (recipes/lm_common.py, as recipes/train_lm.py builds them),
--epochs epochs of --steps_per_epoch steps, with validation after each. A "recipe" run adds
exactly the callbacks train_lm.py runs (`common.fit_callbacks` with the language-model
metrics and the per-epoch sample) and its `verbose=2`; a "bare" run adds none. Runs
alternate (bare, recipe, float32; float32, recipe, bare; ...) for --rounds rounds.
Training tokens/s of a side is steps x batch x sequence length over its median steady
epoch's training part (from the previous epoch's end to the start of validation: the steps
and every callback's per-step and epoch-begin work; the first epoch, tracing, left out);
the whole epochs' rate
(with validation and the recipe's sample) is printed beside it.

It prints each side's settings, tokens/s and MFU, the ratio recipe / bare (per round too),
the chosen settings' speed-up over float32 without XLA, each
callback's own time per epoch, the recipe's validation loss and fit time (with the defaults:
the tiny GPT's 2,000 steps of batch 12), and writes bench_lm.json, bench_lm.png and the
table as TensorBoard text to --output_dir. Target (issues #15, #29): training tokens/s
ratio recipe / bare >= 0.97. Exit status 1 when it is missed.
"""

import os

import _cli
import _fit_timing as timing
import common
import lm_common
from absl import flags
from flagkit import check_flags

from tfaccel.errors import ConfigError

FLAGS = flags.FLAGS
lm_common.define_flags()
flags.DEFINE_integer("rounds", 1, "Rounds of one bare and one recipe run (order alternating).",
                     lower_bound=1)
flags.DEFINE_bool("baseline", True, "Also time a bare fit in float32 without XLA (the "
                  "trials' baseline) when the settings differ from it.")
check_flags(("model", "model_fn"), lambda model="gpt", model_fn=None: _gpt_only(
    model, model_fn))
_cli.define_output_dir("runs/bench_lm", "Where bench_lm.json, the chart and TensorBoard logs "
                       "go.")

def _gpt_only(model, model_fn):
    """bench_lm times tfaccel's GPT (its bare side builds it): a brought model is one line."""
    if model_fn or model != "gpt":
        which = f"--model_fn={model_fn}" if model_fn else f"--model={model}"
        raise ConfigError(
            f"{which}: bench_lm.py times tfaccel's GPT only; train the model with "
            f"recipes/train_lm.py {which} (its tokens/s and MFU are in metrics.json and "
            "TensorBoard), or drop the flag")


TARGET = 0.97  # recipe tokens/s over bare tokens/s, at least
BASELINE = ("float32", False)


def main(argv):
    del argv  # stray arguments were rejected with the flags
    import statistics

    from tfaccel import doctor, plots, summaries
    from tfaccel.keras import keras
    from tfaccel.performance import utilization
    from tfaccel.train import language_model, precision, resume

    length = lm_common.sequence_length()
    resume.parse_backup_freq(FLAGS.backup_freq)
    precision_name = precision.check_precision(FLAGS.precision, allow_auto=True)
    jit_compile = precision.parse_jit_compile(FLAGS.jit_compile)
    strategy = common.strategy_from_flags()
    learning_rate = common.scaled_learning_rate(FLAGS.learning_rate, strategy)
    splits = lm_common.load_text(length)
    unit = language_model.UNITS[FLAGS.tokenizer]
    policy = "float32" if precision_name == "auto" else precision_name
    data_epoch = resume.EpochCounter()  # one pipeline for both sides, as the recipe builds it
    inputs = lm_common.lm_inputs(splits, length, strategy, epoch=data_epoch.epoch)
    os.makedirs(FLAGS.output_dir, exist_ok=True)
    tokens_per_epoch = FLAGS.steps_per_epoch * FLAGS.batch_size * length

    def build(settings=BASELINE, compiled=True):
        precision.set_precision(settings[0])
        keras.utils.set_random_seed(FLAGS.seed)
        with strategy.scope():
            model = lm_common.build_language_model(splits.vocab.size)
            if compiled:
                schedule = common.lr_schedule(learning_rate, inputs.steps_per_epoch)
                lm_common.compile_from_flags(model, schedule, *settings, FLAGS.grad_accum_steps)
        return model

    choice = None  # the recipe's trials, when a setting is 'auto'
    if "auto" in (precision_name, jit_compile):
        _, policy, jit_compile, choice = common.auto_precision(
            build((policy, False), compiled=False), inputs.train, strategy, precision_name,
            policy, jit_compile, lm_common.compile_from_flags, learning_rate,
            inputs.steps_per_epoch, strategy.num_replicas_in_sync)
    chosen = (policy, jit_compile)
    settings = {"bare": chosen, "recipe": chosen}
    if FLAGS.baseline and chosen != BASELINE:
        settings["float32"] = BASELINE

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
        measured, history = timing.run_side(
            "recipe" if side == "recipe" else "bare", lambda: build(settings[side]),
            recipe_callbacks, fit, FLAGS.output_dir, log)
        return dict(measured, val_loss=float(history.history["val_loss"][-1]))

    runs = []
    with open(os.path.join(FLAGS.output_dir, "fit.log"), "w") as log:
        for r in range(FLAGS.rounds):  # alternating, so that a load falls on every side alike
            for side in list(settings)[::1 if r % 2 == 0 else -1]:
                runs.append({"round": r, "side": side, **run(side, log)})
                epochs = timing.steady(runs[-1:], side)
                print(f"round {r + 1}/{FLAGS.rounds} {side:7s}: steady epoch median "
                      f"{1000 * epochs.median:8.1f} ms, mean {1000 * epochs.mean:8.1f} ms",
                      flush=True)

    flops_per_token = utilization.training_flops_per_example(
        build(compiled=False), sequence_length=length) / length  # the traced step's own count
    peaks = {side: doctor.peak(settings[side][0], measure=True) for side in settings}
    peak = peaks["recipe"]
    train = {side: timing.steady(runs, side, "train_seconds") for side in settings}
    epochs = {side: timing.steady(runs, side) for side in settings}
    rates = {side: train[side].rate(tokens_per_epoch) for side in train}
    wall = {side: epochs[side].rate(tokens_per_epoch) for side in epochs}
    ratio, wall_ratio = rates["recipe"] / rates["bare"], wall["recipe"] / wall["bare"]
    per_round = [1 / r for r in timing.round_ratios(runs, "train_seconds")]  # of tokens/s
    recipe_runs = [run_ for run_ in runs if run_["side"] == "recipe"]
    val_loss = statistics.median(run_["val_loss"] for run_ in recipe_runs)
    fit_seconds = max(run_["fit_seconds"] for run_ in recipe_runs)
    met = ratio >= TARGET
    mfu = {side: utilization.mfu(rates[side], flops_per_token, peaks[side]) for side in rates}
    what = {"bare": "bare fit (validation, no callbacks)",
            "recipe": "recipe (train_lm.py's callbacks)",
            "float32": "bare fit, float32 without XLA (the trials' baseline)"}
    rows = [{"what": what[side], "settings": _settings(settings[side]),
             "train_tokens_per_sec": rates[side], "mfu": mfu[side],
             "epoch_tokens_per_sec": wall[side], "median_epoch_ms": 1000 * epochs[side].median}
            for side in ("bare", "recipe", "float32") if side in settings]
    rows += [{"what": f"  {name}", "median_epoch_ms": 1000 * cost.median}
             for name, cost in timing.callback_costs(runs).items()]
    table = summaries.markdown_table(rows, ["what", "settings", "train_tokens_per_sec", "mfu",
                                            "epoch_tokens_per_sec", "median_epoch_ms"])
    speedup = rates["bare"] / rates["float32"] if "float32" in rates else 1.0
    label = (f"GPT {FLAGS.gpt_size} on {splits.source}, batch {FLAGS.batch_size} x {length} "
             f"tokens, {FLAGS.epochs} epochs of {FLAGS.steps_per_epoch} steps x {FLAGS.rounds} "
             f"rounds, {_settings(chosen)}"
             + (f" (chosen by the trials in {choice.seconds:.0f} s of a "
                f"{choice.budget_seconds:.0f} s budget)" if choice else ""))
    machine = doctor.machine_summary()
    verdict = (f"{'PASS' if met else 'FAIL'}  training tokens/s recipe/bare {ratio:.3f} "
               f"(target >= {TARGET:.2f}; per round " + ", ".join(f"{x:.3f}" for x in per_round)
               + f"); whole epochs (validation, the recipe's sample) {wall_ratio:.3f}\n"
               f"settings {_settings(chosen)}: training tokens/s x{speedup:.2f} float32 "
               "without XLA's" + ("" if "float32" in rates else " (the same setting)") + "\n"
               f"recipe: validation loss {val_loss:.4f} nats/{unit} after "
               f"{FLAGS.epochs * FLAGS.steps_per_epoch} steps, fit {fit_seconds:.1f} s")
    utilization_line = (f"model FLOPs: {flops_per_token / 1e6:.2f} MFLOP per token (traced step); "
                        + "; ".join(f"{_settings(settings[side])} peak "
                                    f"{p.flops_per_second / 1e9:,.0f} GFLOP/s = {p.how}"
                                    for side, p in peaks.items() if side != "bare"))
    print(f"\n{label}\nmachine: {machine}\n{utilization_line}\n"
          f"per steady epoch (hook time of each callback):\n{table}\n\n{verdict}")

    extra = ["float32"] if "float32" in rates else []  # the baseline's bar, when timed
    png = plots.plot_rates(["bare fit: training", "recipe: training", "bare fit: whole epochs",
                            "recipe: whole epochs"] + [f"{s}: training" for s in extra],
                           [rates["bare"], rates["recipe"], wall["bare"], wall["recipe"]]
                           + [rates[s] for s in extra],
                           os.path.join(FLAGS.output_dir, "bench_lm.png"),
                           "tokens/s (median steady epoch)",
                           f"{label}: recipe / bare = {ratio:.3f}")
    _cli.write_outputs("bench_lm", {
        "config": {"gpt_size": FLAGS.gpt_size, "sequence_length": length,
                   "batch_size": FLAGS.batch_size, "epochs": FLAGS.epochs,
                   "steps_per_epoch": FLAGS.steps_per_epoch, "rounds": FLAGS.rounds,
                   "precision": policy, "jit_compile": jit_compile, "machine": machine},
        "settings": {side: {"precision": p, "jit_compile": j}
                     for side, (p, j) in settings.items()},
        "trials": None if choice is None else {
            "table": list(choice.table), "seconds": choice.seconds,
            "budget_seconds": choice.budget_seconds},
        "speedup_over_float32": speedup,
        "tokens_per_sec": rates, "mfu": mfu, "flops_per_token": flops_per_token,
        "peak": {"flops_per_second": peak.flops_per_second, "how": peak.how},
        "peaks": {side: {"flops_per_second": p.flops_per_second, "how": p.how}
                  for side, p in peaks.items()},
        "epoch_tokens_per_sec": wall, "ratio": ratio,
        "epoch_ratio": wall_ratio, "round_ratios": per_round, "validation_loss": val_loss,
        "recipe_fit_seconds": fit_seconds, "target": {"min_ratio": TARGET, "met": met},
        "runs": runs}, f"{label}\n\n{machine}\n\n{utilization_line}\n\n{table}\n\n{verdict}",
        png, also=["fit.log"])
    return 0 if met else 1


def _settings(settings):
    """'mixed_bfloat16, XLA' / 'float32' for a (precision, jit_compile)."""
    return settings[0] + (", XLA" if settings[1] else "")


if __name__ == "__main__":
    _cli.run(main)
