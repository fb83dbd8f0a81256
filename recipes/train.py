"""Train a classifier on a dataset and write everything worth inspecting.

    python recipes/train.py                          # CNN on the bundled digits
    python recipes/train.py --flagfile=recipes/presets/digits_cnn.cfg
    tensorboard --logdir runs/digits-cnn/logs --host localhost
    python recipes/train.py --strategy=mirrored --cpu_devices=2          # 2 replicas, no GPU
    tfaccel launch --workers 2 -- recipes/train.py --strategy=multi_worker
    python recipes/train.py --precision=auto --jit_compile=auto --batch_size=auto  # measured
    python recipes/train.py --precision=mixed_float16 --batch_size=256 --grad_accum_steps=4
    python recipes/train.py --parallel=pipeline --stages=2 --micro_batches=4 --cpu_devices=2

--batch_size is global (split over the replicas); rerunning the same command
after a crash resumes from the backup in --backup_dir (see docs/distribution.md);
rerunning it after the run finished only says so (--retrain trains again).
--precision, --jit_compile, --grad_accum_steps, --batch_size=auto and the GPU
memory flags are described in docs/performance.md.

Writes to --model_dir: TensorBoard logs (logs/train, logs/validation: loss,
accuracy, learning rate, examples/sec, and the run's flags as text),
checkpoints/, the final model (model.keras and saved_model/), flags.cfg (the
flags to rerun it) and metrics.json with the test accuracy.
"""

import os
import time

import common
import parallel_flags
from absl import flags

FLAGS = flags.FLAGS
common.define_data_flags()
common.define_model_flags()
common.define_train_flags(auto_batch_size=True)
common.define_distribute_flags()
common.define_backup_flags(default_freq=common.TRAIN_BACKUP_FREQ)
common.define_pipeline_flags()
common.define_schedule_flags()
common.define_performance_flags()
parallel_flags.define_parallel_flags()
flags.DEFINE_bool("diagnose_input", False, "Before training, measure the input pipeline and the "
                  "train step alone and say which is the bottleneck "
                  "(input-bound or compute-bound).")
flags.DEFINE_bool("retrain", False, "Train again even if --model_dir holds a finished run "
                  "(metrics.json and the exports); without it such a rerun only says so. A backup "
                  "of an unfinished run is still resumed.")
# A Keras 3 run's flags are checked with the others when --keras=keras3 says so (a model
# file's Keras is known once it loads: checked then).
common.check_flags(("keras", "parallel", "strategy"),
                   lambda keras, **_: keras == "keras3" and common.check_keras3_flags())


def _plan_says_no(model, micro_batch, policy, replicas):
    """Why the memory plan says one micro-batch of `micro_batch` per device cannot fit, or None."""
    from tfaccel.performance.plan import format_size

    result = common.memory_plan(model, micro_batch, policy, replicas, grad_accum_steps=1)
    return None if result.fits is not False else (
        f"the memory plan needs {format_size(result.total)} per device, more than the "
        f"device's {format_size(result.settings.device_memory)} less the framework margin")


def main(argv):
    common.reject_extra_args(argv)
    parallel_flags.use_default_strategy()  # --parallel: the stages use the devices
    from tfaccel import data, distribute, io, monitor, summaries
    from tfaccel.errors import ConfigError
    from tfaccel.keras import flavour_of, keras
    from tfaccel.keras.bridge import to_flavour
    from tfaccel.performance import accumulate, diagnose, plan, trials
    from tfaccel.train import precision, resume, training

    # --- Inputs: the flags were checked when parsed; what depends on the devices, here.
    backup_freq = resume.parse_backup_freq(FLAGS.backup_freq)
    precision_name = precision.check_precision(FLAGS.precision, allow_auto=True)
    jit_compile = precision.parse_jit_compile(FLAGS.jit_compile)
    # Devices first (allocator, CPU split, GPU memory: fixed once TensorFlow initializes them).
    strategy = common.strategy_from_flags()
    keras.utils.set_random_seed(FLAGS.seed)
    replicas = strategy.num_replicas_in_sync
    autos = [f"--{f}=auto" for f in ("precision", "jit_compile", "batch_size")
             if FLAGS[f].value == "auto"]
    if autos and distribute.num_workers(strategy) > 1:  # workers could measure different winners
        raise ConfigError(f"{', '.join(autos)} cannot run on several workers: measure with one "
                          "process (or benchmarks/bench_precision.py) and pass the chosen values")
    if FLAGS.batch_size != "auto":  # else checked once the search below has chosen it
        per_replica_batch = distribute.per_replica_batch_size(FLAGS.batch_size, replicas)
        accumulate.check_accumulation_steps(FLAGS.grad_accum_steps, FLAGS.batch_size, replicas)
    learning_rate = common.scaled_learning_rate(FLAGS.learning_rate, strategy)
    common.lr_schedule(learning_rate, steps_per_epoch=1)  # e.g. piecewise steps, before the data
    # A finished run (metrics.json, written last, and the exports) is not trained again unless
    # --retrain.
    backup_dir = FLAGS.backup_dir or os.path.join(common.default_model_dir(), "backup")
    finished = training.settle_finished_run(common.default_model_dir(), backup_dir, strategy,
                                            FLAGS.retrain)
    if finished is not None:
        print(f"{common.default_model_dir()} holds a finished run (test accuracy "
              f"{finished.get('test_accuracy', float('nan')):.4f} in metrics.json): not training "
              "again; pass --retrain (or another --model_dir) to train again")
        return
    splits = common.load_data()
    for warning in precision.precision_advice(precision_name):
        print(f"warning: {warning}")
    # The policy must be set before the model is built; auto starts from float32.
    policy = "float32" if precision_name == "auto" else precision_name
    precision.set_precision(policy)
    with strategy.scope():
        model = common.load_model(splits.info)
        model = precision.apply_precision(model, policy)  # float32 outputs, loaded models too
    flavour = flavour_of(model)  # tf_keras or keras3: --keras, or a model file's own Keras
    if flavour == "keras3" and FLAGS.keras != "keras3":  # a Keras 3 file: not checked above
        common.check_keras3_flags()
    # --parallel: stages on devices (else model); a Keras 3 model is split as its verified
    # tf_keras translation, or refused in one line before any training.
    model = parallel_flags.staged_model(model)
    search = None
    if FLAGS.batch_size == "auto":  # measures micro-batches; the global batch is N times that
        with strategy.scope():
            search = trials.find_batch_size(
                model, lambda size: data.build_pipeline(
                    splits.train, common.pipeline_config(size, drop_remainder=True),
                    training=True, info=splits.info, seed=FLAGS.seed),
                compile_fn=lambda m: common.compile_from_flags(m, learning_rate, policy),
                start=replicas * -(-common.AUTO_BATCH_START // replicas),
                max_batch_size=FLAGS.max_batch_size,
                memory_budget_mb=FLAGS.memory_budget_mb or "default",
                budget_seconds=FLAGS.auto_budget_seconds or "default",
                num_examples=splits.info.num_examples["train"],
                fits=lambda size: _plan_says_no(model, size // replicas, policy, replicas))
        FLAGS.batch_size = search.batch_size * FLAGS.grad_accum_steps
        print(f"batch size search:\n{summaries.markdown_table(list(search.table))}\n"
              f"--batch_size=auto chose {FLAGS.batch_size} (search {search.seconds:.1f} s of a "
              f"{search.budget_seconds:.0f} s budget{'; stopped: ' if search.stopped else ''}"
              f"{search.stopped})")
        per_replica_batch = distribute.per_replica_batch_size(FLAGS.batch_size, replicas)
    model_dir, logdir = common.run_dirs(strategy)  # only the chief's files are kept
    print(f"strategy {FLAGS.strategy}: {distribute.describe(strategy)}; global batch "
          f"{FLAGS.batch_size} = {per_replica_batch} per replica x {replicas} replica(s); "
          f"learning rate {learning_rate:g}")

    # --- Model and data.
    data_epoch = resume.EpochCounter()  # epoch k's shuffle is the same after a resume
    fit_batch = common.fit_batch_size(model, FLAGS.batch_size, FLAGS.grad_accum_steps)
    inputs = common.input_from_flags(splits, strategy, fit_batch, epoch=data_epoch.epoch)
    train_ds, val_ds, test_ds = inputs.train, inputs.validation, inputs.test
    updates_per_epoch = inputs.steps_per_epoch * fit_batch // FLAGS.batch_size  # Keras 3: fewer
    schedule = common.lr_schedule(learning_rate, max(1, updates_per_epoch))
    model, policy, jit_compile, choice = common.auto_precision(  # timed trials, if asked
        model, train_ds, strategy, precision_name, policy, jit_compile,
        common.compile_from_flags, learning_rate, inputs.steps_per_epoch, replicas)
    with strategy.scope():  # variables (optimizer slots, metrics) must live in the strategy
        common.compile_from_flags(model, schedule, policy, jit_compile, FLAGS.grad_accum_steps)
    unsplit = getattr(model, "placed", model)  # --parallel: the functional model (same weights)

    # --- Train, logging to TensorBoard.
    common.write_run_config(model_dir, os.path.join(logdir, "train"))
    if splits.bad_files:
        summaries.write_text(os.path.join(logdir, "train"), "data/skipped_bad_files",
                             summaries.markdown_table([{"file": f, "reason": why}
                                                       for f, why in splits.bad_files]))
    train_logdir = os.path.join(logdir, "train")
    summaries.write_text(train_logdir, "performance/layer_dtypes",
                         summaries.markdown_table(precision.layer_dtypes(unsplit)))
    if FLAGS.parallel != "none":
        parallel_flags.write_stage_table(model, train_logdir)
    if search is not None:
        monitor.write_trial_report(train_logdir, "performance/batch_size_search",
                                   list(search.table), ["batch_size"], "examples_per_sec",
                                   path=os.path.join(model_dir, "batch_size_search.png"))
    if choice is not None:
        monitor.write_trial_report(train_logdir, "performance/auto_precision", list(choice.table),
                                   ["precision", "jit_compile"], "examples_per_sec",
                                   path=os.path.join(model_dir, "auto_precision.png"))
    if FLAGS.plan:  # the run's real settings: per-device batch, final precision, accumulation
        result = common.memory_plan(unsplit, per_replica_batch, policy, replicas)
        print("memory plan:\n" + plan.write_plan(train_logdir, result,
                                                 path=os.path.join(model_dir, "memory_plan.png")))
    if FLAGS.diagnose_input:
        diagnosis = diagnose.diagnose_input(model, train_ds, config=inputs.config)
        print(diagnosis.summary())
        diagnose.write_diagnosis(os.path.join(logdir, "train"), diagnosis)
    # NaN stop, backup/resume (and checkpoints/ at each backup; kept after fit until
    # metrics.json is written), logging: the list bench_overhead.py times against a bare fit.
    flops = common.model_flops(unsplit, policy)
    fit_callbacks = common.fit_callbacks(model_dir, logdir, backup_dir, backup_freq, data_epoch,
                                         flavour=flavour_of(model), batch_size=fit_batch,
                                         flops=flops)
    throughput, backup = fit_callbacks.throughput, fit_callbacks.backup
    start = time.perf_counter()
    history = model.fit(train_ds, validation_data=val_ds, epochs=FLAGS.epochs, shuffle=False,
                        callbacks=fit_callbacks.callbacks, verbose=2)
    train_seconds = time.perf_counter() - start

    # --- Evaluate, export, report.
    test = training.evaluate(model, test_ds)
    if flavour_of(unsplit) != flavour:  # --parallel trained a Keras 3 model's tf_keras twin:
        unsplit = to_flavour(unsplit, flavour)  # exported in the Keras it came in (verified)
        common.compile_from_flags(unsplit, schedule, policy)  # its loss and metrics, to evaluate
        unsplit.optimizer.build(unsplit.trainable_variables)  # fresh state, saved whole
    exports = training.export_model(unsplit, model_dir)
    metrics = {
        "dataset": FLAGS.dataset,
        "model": common.model_label(),
        "parameters": int(unsplit.count_params()),
        "epochs": FLAGS.epochs,
        "batch_size": FLAGS.batch_size,
        "test_accuracy": test["accuracy"],
        "test_loss": test["loss"],
        # No epoch ran when a rerun only redoes the export (training had finished in the backup).
        "validation_accuracy": (float(history.history["val_accuracy"][-1])
                                if history.history.get("val_accuracy")
                                else training.evaluate(model, val_ds)["accuracy"]),
        "train_seconds": train_seconds,
        "examples_per_sec": (throughput.history[-1]["examples_per_sec"]
                             if throughput.history else None),
        **common.utilization_metrics(throughput, flops),
        "exports": exports,
        "precision": policy,
        "jit_compile": jit_compile,
        "grad_accum_steps": FLAGS.grad_accum_steps,
        "batch_size_search": list(search.table) if search else None,
        "auto_precision_trials": list(choice.table) if choice else None,
        "auto_precision_seconds": choice.seconds if choice else None,
        "auto_precision_budget_seconds": choice.budget_seconds if choice else None,
        "batch_size_search_seconds": search.seconds if search else None,
        "distribution": distribute.describe(strategy),
        "per_replica_batch_size": per_replica_batch,
        "learning_rate": learning_rate,
        "resumed_at_epoch": backup[-1].resumed_at[0] if backup[-1].resumed_at else None,
        "parallel": FLAGS.parallel,
        "keras": flavour,
        "stages": model.plan.to_json() if FLAGS.parallel != "none" else None,
    }
    summaries.write_scalars(os.path.join(logdir, "test"),
                            {"test_accuracy": test["accuracy"], "test_loss": test["loss"]},
                            step=FLAGS.epochs)
    # Last, atomically: metrics.json marks the run finished (training.read_finished_run); only
    # then may the backup go.
    io.write_json(os.path.join(model_dir, "metrics.json"), metrics)
    if distribute.is_chief(strategy):
        resume.remove_backup(backup_dir)
    print(f"\n{metrics['model']} on {FLAGS.dataset}: test accuracy {test['accuracy']:.4f} "
          f"(loss {test['loss']:.4f}) after {FLAGS.epochs} epochs in {train_seconds:.1f}s")
    common.print_utilization(metrics)
    print(f"wrote {model_dir}: model.keras, saved_model/, metrics.json, checkpoints/, logs/")
    print(f"inspect: {summaries.tensorboard_command(logdir)}")


if __name__ == "__main__":
    common.run(main)
