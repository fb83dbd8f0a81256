"""Make a classifier small and fast, and show the trade-off: one command.

    python recipes/optimize.py                       # digits CNN: train, prune, QAT, TFLite
    python recipes/optimize.py --flagfile=recipes/presets/optimize_digits_cnn.cfg
    python recipes/optimize.py --model=runs/digits-cnn/model.keras --variants=float,int8,qat_int8
    tensorboard --logdir runs/optimize-digits-cnn/logs --host localhost

A zoo --model is trained for --epochs (cosine learning-rate decay by
default); a .keras/.h5/SavedModel --model is taken as trained. Then each
variant in --variants is built and measured as a TFLite file: `float`,
`dynamic` (int8 weights), `int8` (full-integer
post-training quantization calibrated on --calibration_samples training
examples), `float16`, `int16x8`, `qat_int8` (quantization-aware fine-tuning,
then int8) and `pruned_qat_int8` (prune to --sparsity, then prune-preserving
QAT so the zeros survive, then int8). A Keras 3 model (--keras=keras3, a Keras 3
.keras file or --model_fn) can also have Keras 3's own post-training quantization
of its Dense layers: `keras3_int8`, `keras3_int4` (blocks of 128 inputs) and
`keras3_int4_per_channel` (tfaccel.compress.keras3_quantize). The int4 ones are
.tflite files; TFLite cannot convert keras3_int8, so it is measured in Keras
(accuracy on the same inputs, its variables' bytes, timed single-sample calls)
and its row says so (runtime: keras). With --prune_block_size other than 1,1
pruning runs in two stages: 2-D (Dense) kernels in blocks and the others
(convolutions) element-wise first, then every prunable kernel element-wise at
the same sparsity, holding the blocks' zeros. The QAT models are built on
throwaway copies (pruned and stripped for pruned_qat_int8) before any
training, so a layer QAT rejects stops the run at once.

Training and evaluation read the same `tfaccel.data` pipeline as recipes/train.py
(the input pipeline flags, --deterministic on by default so that a rerun reproduces
the report; calibration and the TFLite files see the same inputs as the Keras
models). Under --strategy=multi_worker each worker trains on its shard and only the
chief writes to --model_dir; --scale_lr multiplies every stage's learning rate
(float, pruning, QAT) by the number of replicas. There is no --backup_dir: a killed
run starts again from the beginning, and --strategy=parameter_server is refused.

Writes to --model_dir: float/model.keras, tflite/<variant>.tflite, keras3/<variant>.keras
(a Keras 3 variant measured in Keras; it also holds a fresh optimizer's state), report.md,
report.json and report.png (accuracy vs gzipped size; the pruned_qat_int8 row's
pruned_sparsity is the share of zeros in the pruned layers' int8 weights), and
TensorBoard logs (logs/<stage>: training curves; logs/report: the table as
text, the plot as an image, and per-variant scalars). While it runs, all of it
is in <model_dir>/.partial (TensorBoard can watch <model_dir>/.partial/logs); it
moves up into --model_dir, replacing a previous run's outputs, only when complete.
"""

import os
import time

import common
from absl import flags

VARIANTS = ("float", "dynamic", "int8", "float16", "int16x8", "qat_int8", "pruned_qat_int8",
            "keras3_int8", "keras3_int4", "keras3_int4_per_channel")
PTQ = {"float": "float", "dynamic": "dynamic", "int8": "int8", "float16": "float16",
       "int16x8": "int16x8"}
KERAS3 = {"keras3_int8": "int8", "keras3_int4": "int4",
          "keras3_int4_per_channel": "int4_per_channel"}  # variant -> Keras 3 quantize mode
DESCRIPTIONS = {
    "float": "float32 TFLite", "dynamic": "PTQ dynamic range (int8 weights)",
    "int8": "PTQ full integer int8", "float16": "PTQ float16 weights",
    "int16x8": "PTQ int16 activations, int8 weights", "qat_int8": "QAT, int8",
    "pruned_qat_int8": "pruned + prune-preserving QAT, int8",
    "keras3_int8": "Keras 3 quantize('int8'): Dense int8, activations int8 on the fly",
    "keras3_int4": "Keras 3 quantize('int4'): Dense int4 weights, blocks of 128",
    "keras3_int4_per_channel": "Keras 3 int4 weights, a scale per output channel"}

FLAGS = flags.FLAGS
common.define_data_flags()
common.define_model_flags()
common.define_train_flags(epochs=30)
common.define_distribute_flags()  # no backup flags: a killed run starts again
common.define_pipeline_flags()
# The report compares accuracies a few points apart: a rerun reproduces them exactly.
FLAGS.set_default("deterministic", True)
common.define_schedule_flags()
# The float model should end converged (decayed rate), so QAT's and pruning's deltas measure them.
FLAGS.set_default("lr_schedule", "cosine")
flags.DEFINE_list("variants", ["float", "dynamic", "int8", "qat_int8", "pruned_qat_int8"],
                  f"Variants to build and compare: {', '.join(VARIANTS)} (float is always built: "
                  "the baseline of the ratios).")


def _check_variants(values):
    unknown = [v for v in values if v not in VARIANTS]
    if unknown or not values:
        raise common.ConfigError(f"--variants={','.join(values)}: unknown {', '.join(unknown)}; "
                                 f"choose from {', '.join(VARIANTS)}")


common.check_flag("variants", _check_variants)
flags.DEFINE_float("sparsity", 0.8, "pruned_qat_int8: share of zeros in the pruned layers.")
common.check_flag("sparsity", lambda value: common.choices.check_sparsity(value, "--sparsity"))
flags.DEFINE_integer("prune_epochs", 8, "pruned_qat_int8: epochs of pruning (ramp to --sparsity).",
                     lower_bound=1)
flags.DEFINE_integer("prune_hold_epochs", 4, "pruned_qat_int8 with block pruning: epochs of the "
                     "element-wise second stage.", lower_bound=0)
flags.DEFINE_list("prune_block_size", ["16", "1"], "rows,cols of Dense kernel blocks pruned "
                  "together (16,1: 16 consecutive inputs of one unit, contiguous in TFLite; "
                  "convolutions are pruned element-wise); 1,1 for element-wise pruning only.")
common.require_ints("prune_block_size", "rows,cols: two positive integers", count=2)
flags.DEFINE_float("prune_learning_rate", None, "Learning rate while pruning (default: "
                   "--learning_rate / 2).", lower_bound=0.0)
flags.DEFINE_integer("qat_epochs", 3, "Epochs of quantization-aware fine-tuning.", lower_bound=1)
flags.DEFINE_float("qat_learning_rate", None,
                   "Learning rate of QAT (default: --learning_rate / 10).", lower_bound=0.0)
flags.DEFINE_list("qat_skip_layers", [], "Layers QAT leaves in float (e.g. unsupported ones).")
flags.DEFINE_integer("calibration_samples", 200, "int8/int16x8: training examples that calibrate "
                     "activation ranges.", lower_bound=1)
flags.DEFINE_integer("latency_runs", 3000, "Timed single-sample runs per variant (interleaved "
                     "in 15 rounds; a run of the digits CNN takes ~50 us).",
                     lower_bound=1)
flags.DEFINE_integer("latency_threads", 1, "Interpreter threads for latency.", lower_bound=1)


def main(argv):
    common.reject_extra_args(argv)
    import numpy as np

    from tfaccel import distribute, io, summaries
    from tfaccel.compress import (
        keras3_quantize,
        prune,
        pruning_plan,
        quantize,
        report,
        tflite,
        tflite_eval,
    )
    from tfaccel.keras import flavour_of, keras
    from tfaccel.train import training
    from tfaccel.train.models import is_model_path

    # --- Inputs: everything that can be wrong is checked before anything is written.
    variants = ["float"] + [v for v in dict.fromkeys(FLAGS.variants) if v != "float"]
    sparsity = pruning_plan.check_sparsity(FLAGS.sparsity, "--sparsity")
    block = common.int_list(FLAGS.prune_block_size)  # rows,cols: checked with the flags
    strategy = common.strategy_from_flags()  # devices first, then the strategy
    keras.utils.set_random_seed(FLAGS.seed)
    distribute.per_replica_batch_size(FLAGS.batch_size, strategy.num_replicas_in_sync)
    learning_rate = common.scaled_learning_rate(FLAGS.learning_rate, strategy)
    prune_lr = common.scaled_learning_rate(FLAGS.prune_learning_rate, strategy) \
        if FLAGS.prune_learning_rate is not None else learning_rate / 2
    qat_lr = common.scaled_learning_rate(FLAGS.qat_learning_rate, strategy) \
        if FLAGS.qat_learning_rate is not None else learning_rate / 10
    splits = common.load_data()
    inputs = common.input_from_flags(splits, strategy)
    train_ds, test_ds, steps = inputs.train, inputs.test, inputs.steps_per_epoch
    with strategy.scope():
        model = common.load_model(splits.info)
    wanted3 = [v for v in variants if v in KERAS3]
    if wanted3 and flavour_of(model) != "keras3":
        raise common.ConfigError(f"--variants={','.join(wanted3)} needs a Keras 3 model: "
                                 "--keras=keras3 or a Keras 3 .keras file")
    skip = FLAGS.qat_skip_layers or None
    stages = [("prune", pruning_plan.PruneConfig(block_size=block), FLAGS.prune_epochs)]
    if block != (1, 1) and FLAGS.prune_hold_epochs:
        stages.append(("prune_hold", pruning_plan.PruneConfig(schedule="constant"),
                       FLAGS.prune_hold_epochs))
    for _, config, epochs in stages if "pruned_qat_int8" in variants else ():
        pruning_plan.make_pruning_schedule(sparsity, epochs, steps, config)
    # QAT models built now on throwaway copies (after pruning and stripping one for
    # pruned_qat_int8), so that whatever QAT rejects stops the run before any training.
    with strategy.scope():
        if "qat_int8" in variants:
            quantize.check_quantize_aware(model, skip_layers=skip)
        if "pruned_qat_int8" in variants:
            quantize.check_quantize_aware(model, "prune_preserve", skip_layers=skip,
                                          prune_configs=[config for _, config, _ in stages])
    # Outputs go to <model_dir>/.partial and move up into --model_dir (report files last) only
    # when the run is complete: a failed or killed run leaves no half-set that looks like one.
    final_dir, _ = common.run_dirs(strategy, "optimize-")  # only the chief's files are kept
    model_dir = os.path.join(final_dir, ".partial")
    logdir = os.path.join(model_dir, "logs")
    # The test examples as the models see them, in one fixed order for every variant.
    test_x, labels = (np.concatenate(a) for a in zip(*test_ds.as_numpy_iterator()))
    report.discard(model_dir)  # a stale one from a killed run
    os.makedirs(model_dir)
    common.write_run_config(model_dir, os.path.join(logdir, "report"))
    start = time.perf_counter()

    def compiled(m, learning_rate):
        with strategy.scope():
            return common.compile_from_flags(m, learning_rate)

    def fit(m, learning_rate, epochs, stage, callbacks=()):
        compiled(m, learning_rate)
        if epochs:
            rate = f"{learning_rate:g}" if isinstance(learning_rate, float) else \
                type(learning_rate).__name__
            print(f"--- {stage}: {epochs} epochs, learning rate {rate}")
            m.fit(train_ds, epochs=epochs, verbose=2, shuffle=False, callbacks=[
                training.StopOnNonFiniteLoss(), *callbacks,
                summaries.LearningRateLogger(os.path.join(logdir, stage, "train")),
                summaries.TensorBoard(os.path.join(logdir, stage))])
        return m

    def predictions(m):
        return m.predict(test_x, batch_size=FLAGS.batch_size, verbose=0).argmax(-1)

    # --- Float model: trained here (zoo) or taken as given (a saved model).
    trained_here = not is_model_path(FLAGS.model) or bool(FLAGS.model_fn)
    fit(model, common.lr_schedule(learning_rate, steps), FLAGS.epochs if trained_here else 0,
        "float")
    float_keras = training.evaluate(model, test_ds)["accuracy"]
    float_pred = predictions(model)
    with io.atomic_path(os.path.join(model_dir, "float", "model.keras")) as tmp:
        model.save(tmp)
    print(f"float Keras test accuracy {float_keras:.4f}")

    # --- Build each variant as a .tflite file, remembering the Keras model it came from.
    tflite_dir = os.path.join(model_dir, "tflite")
    built = {}  # variant -> (path, predictions of its Keras source)
    for variant in [v for v in variants if v in PTQ]:
        path = tflite.convert_to_tflite(model, os.path.join(tflite_dir, f"{variant}.tflite"),
                                        mode=PTQ[variant], representative_data=train_ds.unbatch(),
                                        num_calibration_samples=FLAGS.calibration_samples)
        built[variant] = (path, float_pred)
    extra, in_keras = {}, {}  # in_keras: variant -> its Keras 3 model (no TFLite form)
    for variant in wanted3:
        made = keras3_quantize.keras3_variant(model, KERAS3[variant],
                                              os.path.join(tflite_dir, f"{variant}.tflite"))
        extra[f"{variant}_quantized_layers"] = made.quantized["layers"]
        extra[f"{variant}_quantized_share"] = made.quantized["share"]
        if made.runtime == "tflite":
            built[variant] = (made.path, predictions(made.model))
        else:
            print(f"{variant}: measured in Keras ({made.reason})")
            in_keras[variant] = made.model
    if "qat_int8" in variants:
        with strategy.scope():
            qat = quantize.quantize_aware(model, skip_layers=skip)
        fit(qat, qat_lr, FLAGS.qat_epochs, "qat")
        extra["qat_keras_accuracy"] = training.evaluate(qat, test_ds)["accuracy"]
        path = tflite.convert_to_tflite(qat, os.path.join(tflite_dir, "qat_int8.tflite"), "int8")
        built["qat_int8"] = (path, predictions(qat))
    if "pruned_qat_int8" in variants:
        pruned, pruned_layers = model, set()
        for stage, config, epochs in stages:
            pruned_layers |= set(pruning_plan.plan_pruning(pruned, config).pruned)
            with strategy.scope():
                wrapped, callbacks = prune.prune_to_sparsity(
                    pruned, sparsity, epochs, steps, config,
                    logdir=os.path.join(logdir, stage, "sparsity"))
            fit(wrapped, prune_lr, epochs, stage, callbacks)
            with strategy.scope():  # the stripped copy's variables must belong to the strategy
                pruned = prune.strip_pruning(wrapped)
        extra["pruned_keras_accuracy"] = training.evaluate(compiled(pruned, prune_lr),
                                                           test_ds)["accuracy"]
        with strategy.scope():
            pqat = quantize.quantize_aware(pruned, scheme="prune_preserve", skip_layers=skip)
        fit(pqat, qat_lr, FLAGS.qat_epochs, "pruned_qat")
        extra["pruned_qat_keras_accuracy"] = training.evaluate(pqat, test_ds)["accuracy"]
        path = tflite.convert_to_tflite(pqat, os.path.join(tflite_dir, "pruned_qat_int8.tflite"),
                                        "int8")
        built["pruned_qat_int8"] = (path, predictions(pqat))
        extra["pruned_qat_int8_weight_sparsity"] = tflite_eval.weight_sparsity(path)["sparsity"]
        extra["pruned_layers"] = sorted(pruned_layers)
        pruned_sparsity = tflite_eval.weight_sparsity(path, layer_names=pruned_layers)["sparsity"]

    # --- Measure every file: accuracy, agreement, size, latency (interleaved, same load).
    latency = tflite_eval.compare_latency({v: p for v, (p, _) in built.items()},
                                          num_runs=FLAGS.latency_runs, rounds=15,
                                          num_threads=FLAGS.latency_threads)
    measured = []
    for variant, (path, source_pred) in built.items():
        print(f"evaluating {variant}")
        result = tflite_eval.evaluate_tflite(path, (test_x, labels))
        measured.append({
            "variant": variant, "description": DESCRIPTIONS[variant],
            "accuracy": result["accuracy"], **tflite_eval.tflite_sizes(path),
            "latency_p50_us": latency[variant]["p50_us"],
            "latency_mean_us": latency[variant]["mean_us"],
            "agreement_with_float": tflite_eval.prediction_agreement(result["predictions"],
                                                                     float_pred),
            "agreement_with_source": tflite_eval.prediction_agreement(result["predictions"],
                                                                      source_pred),
            **({"pruned_sparsity": pruned_sparsity} if variant == "pruned_qat_int8" else {}),
            "runtime": "tflite", "path": os.path.join(final_dir, os.path.relpath(path, model_dir))})
    # Keras 3 variants TFLite cannot convert: the same test inputs, timed the same way, in Keras
    # (against the float Keras model, whose latency is the fair baseline for them).
    keras_latency = keras3_quantize.compare_keras_latency(
        {"float_keras": model, **in_keras}, num_runs=FLAGS.latency_runs, rounds=15) \
        if in_keras else {}
    for variant, quantized in in_keras.items():
        print(f"evaluating {variant} (Keras)")
        pred = predictions(quantized)
        lat, base = keras_latency[variant], keras_latency["float_keras"]
        path = os.path.join(model_dir, "keras3", f"{variant}.keras")
        with io.atomic_path(path) as tmp:
            quantized.save(tmp)
        measured.append({
            "variant": variant, "accuracy": float(np.mean(pred == labels.reshape(-1))),
            **keras3_quantize.keras_weight_sizes(quantized),
            "latency_p50_us": lat["p50_us"], "latency_mean_us": lat["mean_us"],
            "agreement_with_float": tflite_eval.prediction_agreement(pred, float_pred),
            "description": f"{DESCRIPTIONS[variant]}; runs in Keras (no TFLite form), size = its "
                           f"variables, {base['p50_us'] / lat['p50_us']:.2f}x float Keras speed",
            "runtime": "keras", "speedup_vs_float_keras": base["p50_us"] / lat["p50_us"],
            "path": os.path.join(final_dir, os.path.relpath(path, model_dir))})
    if in_keras:
        extra["float_keras_latency_p50_us"] = keras_latency["float_keras"]["p50_us"]
    measured.sort(key=lambda row: variants.index(row["variant"]))  # as --variants lists them
    rows = report.comparison_rows(measured, "float", reference_accuracy=float_keras)

    # --- Report: markdown + JSON + PNG, and the same in TensorBoard.
    summary = {"dataset": FLAGS.dataset, "model": common.model_label(),
               "parameters": int(model.count_params()), "float_keras_accuracy": float_keras,
               "trained_here": trained_here, "sparsity_target": sparsity,
               "prune_block_size": "x".join(map(str, block)),
               "latency_threads": FLAGS.latency_threads, "latency_runs": FLAGS.latency_runs,
               "distribution": distribute.describe(strategy)["strategy"],
               "seconds_training_to_report": time.perf_counter() - start, **extra,
               "command": common.command_line()}
    paths = report.write_report(model_dir, os.path.join(logdir, "report"), rows, summary,
                                title=f"Optimizing {summary['model']} on {FLAGS.dataset}",
                                reference_accuracy=float_keras)
    summaries.write_scalars(os.path.join(logdir, "report"), {
        **{f"accuracy/{r['variant']}": r["accuracy"] for r in rows},
        **{f"gzip_ratio/{r['variant']}": r["gzip_ratio"] for r in rows},
        **{f"speedup/{r['variant']}": r["speedup"] for r in rows}})
    report.publish(model_dir, final_dir, last=[os.path.basename(p) for p in paths.values()
                                               if p != paths["logdir"]])
    with open(os.path.join(final_dir, "report.md")) as f:
        print("\n" + f.read())
    print(f"wrote {final_dir}: report.md, report.json, report.png, tflite/, float/, "
          f"{'keras3/, ' if in_keras else ''}logs/")
    print(f"inspect: {summaries.tensorboard_command(os.path.join(final_dir, 'logs'))}")


if __name__ == "__main__":
    common.run(main, model_dir_prefix="optimize-")
