"""Prune a trained classifier to a target sparsity, export it small, and compare it to the original.

    python recipes/prune.py                                   # train the digits CNN, prune to 80%
    python recipes/prune.py --flagfile=recipes/presets/prune_digits_cnn.cfg
    python recipes/prune.py --model=runs/digits-cnn/model.keras --sparsity=0.9 --prune_epochs=30
    python recipes/prune.py --m_by_n=2,4                      # 2:4 structured sparsity
    tensorboard --logdir runs/prune-digits-cnn/logs --host localhost

A zoo --model is trained first for --epochs (and reused by a rerun with the
same flags); a .keras/.h5/SavedModel --model is taken as trained. Pruning then
fine-tunes for --prune_epochs (20) at --prune_learning_rate, ramping sparsity up over
the first two thirds (--end_epoch) and holding it for the rest. Rerunning the
same command after a crash resumes pruning from <model_dir>/backup_prune with
its pruning step.

Training and evaluation read the same `tfaccel.data` pipeline as recipes/train.py
(the input pipeline flags, --deterministic on by default so that a rerun reproduces the
report; each worker its shard under --strategy=multi_worker, where only the chief
writes to --model_dir); --scale_lr multiplies --learning_rate and
--prune_learning_rate by the number of replicas. --strategy=parameter_server is
refused: no recipe runs parameter servers.

Writes to --model_dir: baseline/ and pruned/ (model.h5 without optimizer,
model.tflite, model_sparse.tflite), pruned/model.keras, report.md and
report.json (accuracy, sparsity per layer, sizes raw and gzipped, ratios),
sparsity.png, and TensorBoard logs (logs/pruning: sparsity per layer and
target each epoch; logs/train, logs/validation; logs/report: the report,
plot and final scalars).
"""

import json
import os
import time

import common
from absl import flags

FLAGS = flags.FLAGS
common.define_data_flags()
common.define_model_flags()
common.define_train_flags()
common.define_distribute_flags()
common.define_backup_flags()
common.define_pipeline_flags()
# The report compares accuracies a few points apart: a rerun reproduces them exactly.
FLAGS.set_default("deterministic", True)
flags.DEFINE_enum("precision", "float32", common.choices.PRECISIONS, "Mixed precision policy.")
flags.DEFINE_float("sparsity", 0.8, "Target share of zero weights in the pruned layers, in [0, 1).")
flags.DEFINE_integer("prune_epochs", 20, "Epochs of fine-tuning while pruning.", lower_bound=1)
flags.DEFINE_float("prune_learning_rate", None, "Learning rate while pruning "
                   "(default: --learning_rate; a tenth of it recovered less accuracy here).",
                   lower_bound=0.0)
flags.DEFINE_enum("pruning_schedule", "polynomial", common.choices.PRUNING_SCHEDULES,
                  "polynomial (ramp up) or constant.")
flags.DEFINE_float("begin_epoch", 0.0, "Fine-tuning epoch where pruning starts.")
flags.DEFINE_float("end_epoch", None, "Epoch where the ramp reaches --sparsity "
                   "(default: two thirds of --prune_epochs).")
flags.DEFINE_integer("pruning_frequency", None,
                     "Steps between mask updates (default: ~20 per ramp).")
flags.DEFINE_list("m_by_n", [], "e.g. 2,4: at least 2 zeros in every 4 consecutive weights "
                  "(overrides --sparsity with m/n).")
common.require_ints("m_by_n", "m,n: integers with 0 < m < n (at least m zeros in every n "
                    "consecutive weights)", count=2, example="2,4", rule=lambda mn: mn[0] < mn[1],
                    allow_empty=True)
flags.DEFINE_list("block_size", ["1", "1"], "rows,cols of weight blocks pruned together (2-D "
                  "kernels; convolutions are pruned element-wise).")
common.require_ints("block_size", "rows,cols: two positive integers", count=2)
flags.DEFINE_enum("block_pooling", "AVG", common.choices.BLOCK_POOLINGS, "A block's magnitude.")
flags.DEFINE_enum("pruning_policy", None, common.choices.PRUNING_POLICIES, "xnnpack: prune only "
                  "1x1 convolutions XNNPACK runs sparse.")
flags.DEFINE_list("include_layers", [], "Layer names or classes to prune (default: automatic).")
flags.DEFINE_list("exclude_layers", [], "Layer names or classes never to prune.")
flags.DEFINE_integer("min_weights", 2048, "Leave layers with fewer weights dense.", lower_bound=0)
flags.DEFINE_bool("prune_first_conv", False, "Also prune the first convolution.")
flags.DEFINE_bool("retrain_baseline", False, "Train the zoo baseline again even if this "
                  "--model_dir holds one trained with the same flags.")
flags.DEFINE_bool("tflite", True, "Also convert both models to TFLite and measure them.")


def _check_pruning(sparsity, m_by_n, block_size, block_pooling, pruning_policy, prune_epochs,
                   begin_epoch, end_epoch, pruning_frequency):
    """The rules `make_pruning_schedule` and `plan_pruning` apply to the pruning flags (m_by_n
    and block_size are integers: checked by their own validators, which run first)."""
    if not m_by_n:  # --m_by_n overrides --sparsity
        common.choices.check_sparsity(sparsity, "--sparsity")
    common.choices.check_prune_pattern(common.int_list(m_by_n) if m_by_n else None,
                                       common.int_list(block_size), block_pooling,
                                       pruning_policy)
    common.choices.check_pruning_epochs(prune_epochs, begin_epoch, end_epoch, pruning_frequency)


common.check_flags(("sparsity", "m_by_n", "block_size", "block_pooling", "pruning_policy",
                    "prune_epochs", "begin_epoch", "end_epoch", "pruning_frequency"),
                   _check_pruning)

BASELINE_KEYS = ("dataset", "model", "model_fn", "epochs", "batch_size", "optimizer",
                 "learning_rate", "scale_lr", "seed", "precision", "shuffle_buffer",
                 "random_flip", "standardize")


def prune_config():
    from tfaccel.compress.pruning_plan import PruneConfig

    def ints(values):
        return common.int_list(values) if values else None

    return PruneConfig(
        schedule=FLAGS.pruning_schedule, begin_epoch=FLAGS.begin_epoch, end_epoch=FLAGS.end_epoch,
        frequency=FLAGS.pruning_frequency, m_by_n=ints(FLAGS.m_by_n),
        block_size=ints(FLAGS.block_size), block_pooling=FLAGS.block_pooling,
        policy=FLAGS.pruning_policy, include=tuple(FLAGS.include_layers),
        exclude=tuple(FLAGS.exclude_layers), keep_first_conv=not FLAGS.prune_first_conv,
        min_weights=FLAGS.min_weights)


def read_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def main(argv):
    common.reject_extra_args(argv)
    from tfaccel import distribute, io, plots, summaries
    from tfaccel.compress import prune, pruning_plan, sparsity
    from tfaccel.keras import keras
    from tfaccel.train import precision, resume, training
    from tfaccel.train.models import is_model_path, load_model_file

    # --- Inputs: the flags were checked when parsed; what depends on the data, here.
    config = prune_config()
    target = config.m_by_n[0] / config.m_by_n[1] if config.m_by_n else \
        pruning_plan.check_sparsity(FLAGS.sparsity, "--sparsity")
    backup_freq = resume.parse_backup_freq(FLAGS.backup_freq)
    precision.check_precision(FLAGS.precision)
    strategy = common.strategy_from_flags()  # devices first, then the strategy
    keras.utils.set_random_seed(FLAGS.seed)
    distribute.per_replica_batch_size(FLAGS.batch_size, strategy.num_replicas_in_sync)
    learning_rate = common.scaled_learning_rate(FLAGS.learning_rate, strategy)
    prune_lr = (common.scaled_learning_rate(FLAGS.prune_learning_rate, strategy)
                if FLAGS.prune_learning_rate is not None else learning_rate)
    splits = common.load_data()
    inputs = common.input_from_flags(splits, strategy)
    train_ds, val_ds, test_ds, steps = (inputs.train, inputs.validation, inputs.test,
                                        inputs.steps_per_epoch)
    pruning_plan.make_pruning_schedule(target, FLAGS.prune_epochs, steps, config)
    model_dir, logdir = common.run_dirs(strategy, "prune-")  # only the chief's files are kept
    shared_dir = common.default_model_dir("prune-")  # what every worker reads
    backup_dir = FLAGS.backup_dir or os.path.join(shared_dir, "backup_prune")
    # A baseline trained here with the same flags is reused: the chief's, by every worker.
    baseline_path = os.path.join(shared_dir, "baseline", "model.keras")
    baseline_flags = {k: getattr(FLAGS, k) for k in BASELINE_KEYS}
    flags_path = os.path.join(shared_dir, "baseline", "flags.json")
    given_trained = is_model_path(FLAGS.model) and not FLAGS.model_fn
    reuse = (not given_trained and not FLAGS.retrain_baseline and os.path.exists(baseline_path)
             and read_json(flags_path) == json.loads(json.dumps(baseline_flags)))
    precision.set_precision(FLAGS.precision)
    with strategy.scope():
        model = load_model_file(baseline_path) if reuse else common.load_model(splits.info)
        model = precision.apply_precision(model, FLAGS.precision)
    plan = pruning_plan.plan_pruning(model, config)
    common.write_run_config(model_dir, os.path.join(logdir, "train"))

    # --- Baseline: a saved model as given, a zoo model trained for --epochs (or reused).
    if given_trained or reuse:
        print(f"baseline: {'reusing ' + baseline_path if reuse else FLAGS.model} (not retrained)")
    elif FLAGS.epochs:
        with strategy.scope():
            common.compile_from_flags(model, learning_rate, FLAGS.precision)
        baseline_logdir = os.path.join(logdir, "baseline")
        model.fit(train_ds, validation_data=val_ds, epochs=FLAGS.epochs, verbose=2, shuffle=False,
                  callbacks=[training.StopOnNonFiniteLoss(),
                             summaries.LearningRateLogger(os.path.join(baseline_logdir, "train")),
                             summaries.TensorBoard(baseline_logdir)])
    with strategy.scope():
        common.compile_from_flags(model, learning_rate, FLAGS.precision)
    baseline = training.evaluate(model, test_ds)
    if not given_trained and not reuse:
        sparsity.save_without_optimizer(model, os.path.join(model_dir, "baseline", "model.keras"))
        io.write_json(os.path.join(model_dir, "baseline", "flags.json"), baseline_flags)
    baseline_sizes = sparsity.model_sizes(model, os.path.join(model_dir, "baseline"),
                                          tflite=FLAGS.tflite)

    # --- Prune while fine-tuning; a rerun after a crash resumes from the backup.
    print(f"pruning {', '.join(plan.pruned)} to {target:.0%}; left dense: "
          + ("; ".join(f"{k} ({v})" for k, v in plan.skipped.items()) or "none")
          + (f"; element-wise (blocks need 2-D kernels): {', '.join(plan.element_wise)}"
             if plan.element_wise else ""))
    with strategy.scope():
        pruned, callbacks = prune.prune_to_sparsity(
            model, target, FLAGS.prune_epochs, steps, config,
            logdir=os.path.join(logdir, "pruning"), backup_dir=backup_dir,
            backup_freq=backup_freq, delete_backup_after_fit=False)  # removed after the report
        common.compile_from_flags(pruned, prune_lr, FLAGS.precision)
    logger = callbacks[-1]
    start = time.perf_counter()
    pruned.fit(train_ds, validation_data=val_ds, epochs=FLAGS.prune_epochs, verbose=2,
               shuffle=False,
               callbacks=[training.StopOnNonFiniteLoss(), *callbacks,
                          summaries.LearningRateLogger(os.path.join(logdir, "train")),
                          summaries.TensorBoard(logdir, update_freq="epoch")])
    prune_seconds = time.perf_counter() - start
    final_step = pruning_plan.pruning_step(pruned)

    # --- Strip, measure from the saved weights, export.
    with strategy.scope():
        stripped = prune.strip_pruning(pruned)
        common.compile_from_flags(stripped, prune_lr, FLAGS.precision)
    result = training.evaluate(stripped, test_ds)
    sizes = sparsity.model_sizes(stripped, os.path.join(model_dir, "pruned"), tflite=FLAGS.tflite)
    saved = keras.models.load_model(sizes["h5"]["path"], compile=False)
    report = sparsity.sparsity_report(saved, plan.pruned)
    pattern = sparsity.check_m_by_n(saved, config.m_by_n, plan.pruned) if config.m_by_n else None
    sparsity.save_without_optimizer(stripped, os.path.join(model_dir, "pruned", "model.keras"))
    tflite_accuracy = None
    if FLAGS.tflite:
        from tfaccel.compress.tflite_eval import evaluate_tflite

        tflite_accuracy = evaluate_tflite(sizes["tflite_sparse"]["path"], test_ds,
                                          progress=False)["accuracy"]

    # --- Report: markdown + JSON, plot, TensorBoard.
    size_rows = [{"file": k, "baseline_bytes": baseline_sizes[k]["bytes"],
                  "pruned_bytes": sizes[k]["bytes"],
                  "baseline_gzip": baseline_sizes[k]["gzip_bytes"],
                  "pruned_gzip": sizes[k]["gzip_bytes"],
                  "gzip_ratio": sizes[k]["gzip_bytes"] / baseline_sizes[k]["gzip_bytes"]}
                 for k in sizes]
    resumed = next((c.resumed_at for c in callbacks if isinstance(c, resume.ResumeReporter)), None)
    results = {
        "dataset": FLAGS.dataset, "model": common.model_label(), "precision": FLAGS.precision,
        "distribution": distribute.describe(strategy), "target_sparsity": target,
        "baseline_test_accuracy": baseline["accuracy"], "pruned_test_accuracy": result["accuracy"],
        "accuracy_change_points": 100 * (result["accuracy"] - baseline["accuracy"]),
        "pruned_tflite_test_accuracy": tflite_accuracy,
        "pruned_layers": list(plan.pruned), "dense_layers": plan.skipped,
        "sparsity": report, "m_by_n": list(config.m_by_n) if config.m_by_n else None,
        "m_by_n_check": pattern, "sizes": {"baseline": baseline_sizes, "pruned": sizes},
        "size_table": size_rows, "prune_epochs": FLAGS.prune_epochs, "steps_per_epoch": steps,
        "prune_learning_rate": prune_lr, "pruning_step_at_start": logger.start_step,
        "pruning_step_at_end": final_step, "resumed_at_epoch": resumed[0] if resumed else None,
        "prune_seconds": prune_seconds, "optimizer_in_saved_files": False,
        "command": common.command_line(),
    }
    layer_rows = [{**r, "dense_because": plan.skipped.get(r["layer"], "")}
                  for r in report["layers"]]
    markdown = "\n\n".join([
        f"# Pruning {results['model']} on {FLAGS.dataset} to {target:.0%}",
        f"`{common.command_line()}`",
        summaries.markdown_table([
            {"": "test accuracy", "baseline": baseline["accuracy"], "pruned": result["accuracy"]},
            {"": "sparsity of pruned layers", "baseline": "",
             "pruned": report["pruned"]["sparsity"]},
            {"": "sparsity of all weights", "baseline": "",
             "pruned": report["model"]["sparsity"]}]),
        (f"Accuracy change: {results['accuracy_change_points']:+.2f} points; pruned TFLite "
         f"(sparse) accuracy: "
         f"{'not measured' if tflite_accuracy is None else f'{tflite_accuracy:.4f}'}"),
        "## Sparsity per layer (measured from the saved weights)",
        summaries.markdown_table(layer_rows, ["layer", "shape", "weights", "zeros", "sparsity",
                                              "pruned", "dense_because"]),
        *(["## 2:4 check", summaries.markdown_table(
            [{"layer": k, **v} for k, v in pattern.items()])] if pattern else []),
        "## Sizes (bytes; .h5 saved without optimizer)",
        summaries.markdown_table(size_rows),
        f"Pruning step {logger.start_step} -> {final_step}"
        + (f" (resumed at epoch {resumed[0]})" if resumed else ""),
    ])
    io.write_json(os.path.join(model_dir, "report.json"), results)
    io.write_text(os.path.join(model_dir, "report.md"), markdown + "\n")
    png = plots.plot_sparsity(report, os.path.join(model_dir, "sparsity.png"), target=target)
    report_dir = os.path.join(logdir, "report")
    summaries.write_text(report_dir, "pruning/report", markdown, step=FLAGS.prune_epochs)
    summaries.write_png(report_dir, "pruning/sparsity_per_layer", png, step=FLAGS.prune_epochs)
    summaries.write_scalars(report_dir, {
        "test_accuracy/baseline": baseline["accuracy"], "test_accuracy/pruned": result["accuracy"],
        "sparsity/pruned_layers": report["pruned"]["sparsity"],
        **{f"size/{r['file']}_gzip_ratio": r["gzip_ratio"] for r in size_rows}},
        step=FLAGS.prune_epochs)
    if distribute.is_chief(strategy):  # every result is in place: the backup may go
        resume.remove_backup(backup_dir)
    print(f"\n{markdown}\n\nwrote {model_dir}: report.md, report.json, sparsity.png, pruned/, "
          f"baseline/, logs/\ninspect: {summaries.tensorboard_command(logdir)}")


if __name__ == "__main__":
    common.run(main, model_dir_prefix="prune-")
