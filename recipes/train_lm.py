"""Train a decoder-only Transformer language model on text and write everything worth inspecting.

    python recipes/train_lm.py                       # tiny GPT on pydoc_data.topics, ~3 min
    python recipes/train_lm.py --data_dir=my_book.txt --gpt_size=small --sequence_length=256
    python recipes/train_lm.py --precision=mixed_bfloat16 --grad_accum_steps=4 --recompute
    python recipes/train_lm.py --strategy=mirrored --cpu_devices=2      # 2 replicas, no GPU
    python recipes/train_lm.py --parallel=pipeline --stage_boundaries=block_2_ln_1 \
        --micro_batches=4 --cpu_devices=2                              # 2 stages, GPipe
    python recipes/train_lm.py --model=gpt2          # KerasHub's GPT2CausalLM, the same sizes
    PYTHONPATH=my_folder python recipes/train_lm.py --model_fn=my_lms:build   # your Keras 3 LM
    python recipes/train_lm.py --precision=float32 --jit_compile=false --profile_steps=20,24
    python recipes/generate.py --model_dir=runs/lm-text-gpt --prompt="The "
    tensorboard --logdir runs/lm-text-gpt/logs --host localhost

An epoch is --steps_per_epoch optimizer steps of --batch_size windows of --sequence_length
tokens (the defaults: 8 x 250 steps of 12 x 64 characters); after each, the validation
loss over the last 10% of the text and a sample from --prompt. The learning rate warms up
for half an epoch, then follows a cosine to a tenth of --learning_rate. Rerunning the same
command after a crash resumes from the backup (epoch k sees the same windows either way).
By default the precision and XLA are what wins on this machine (--precision=auto,
--jit_compile=auto: timed trials within --auto_budget_seconds, their table printed and
logged); --profile_steps traces chosen steps with TensorFlow's profiler.

Writes to --model_dir: TensorBoard logs (loss, accuracy, bits per character, perplexity,
tokens/s, learning rate, peak memory; the samples under Text), checkpoints/, the model
(model.keras with vocabulary.json: what recipes/generate.py loads), model.tflite and
model_int8.tflite (dynamic-range int8) with their validation losses, flags.cfg and
metrics.json.
"""

import os
import time

import common
import lm_common
import parallel_flags
from absl import flags

FLAGS = flags.FLAGS
lm_common.define_flags()
parallel_flags.define_parallel_flags(recompute=False)  # --recompute is the blocks' (GPT flags)
lm_common.check_model_flags()  # --model=gpt2/--model_fn: the GPT-only flags refused
flags.DEFINE_bool("tflite", True, "Export model.tflite and model_int8.tflite (dynamic-range "
                  "int8) and report their validation losses beside the Keras model's.")
flags.DEFINE_bool("retrain", False, "Train again even if --model_dir holds a finished run.")
flags.DEFINE_list("profile_steps", [], "start,stop (e.g. 20,24): trace these training steps "
                  "with TensorFlow's profiler into logs/train/plugins/profile (TensorBoard's "
                  "Profile tab) and print the time in each kind of op.")
common.require_ints("profile_steps", "start,stop: two step numbers, start <= stop", count=2,
                    example="20,24", rule=lambda ints: ints[0] <= ints[1], allow_empty=True)


def main(argv):
    common.reject_extra_args(argv)
    parallel_flags.use_default_strategy()  # --parallel: the stages use the devices
    from tfaccel import distribute, io, summaries
    from tfaccel.errors import ConfigError
    from tfaccel.keras import flavour_of, keras
    from tfaccel.performance import accumulate, plan, step_profile
    from tfaccel.train import generate, gpt, language_model, precision, resume, training

    # --- Inputs: everything that can be wrong is checked before anything is written.
    length = lm_common.sequence_length()
    backup_freq = resume.parse_backup_freq(FLAGS.backup_freq)
    precision_name = precision.check_precision(FLAGS.precision, allow_auto=True)
    jit_compile = precision.parse_jit_compile(FLAGS.jit_compile)
    # The text and the prompt first (NumPy only): a bad file is one line before any device
    # is set up or a finished run's files are touched.
    splits = lm_common.load_text(length)
    unit = language_model.UNITS[FLAGS.tokenizer]
    if FLAGS.sample_tokens:
        splits.vocab.encode(FLAGS.prompt)  # a prompt the vocabulary cannot spell: one line now
    strategy = common.strategy_from_flags()
    keras.utils.set_random_seed(FLAGS.seed)
    replicas = strategy.num_replicas_in_sync
    per_replica_batch = distribute.per_replica_batch_size(FLAGS.batch_size, replicas)
    accumulate.check_accumulation_steps(FLAGS.grad_accum_steps, FLAGS.batch_size, replicas)
    if "auto" in (precision_name, jit_compile) and distribute.num_workers(strategy) > 1:
        raise ConfigError("--precision/--jit_compile=auto cannot run on several workers: "
                          "measure with one process and pass the chosen values")
    learning_rate = common.scaled_learning_rate(FLAGS.learning_rate, strategy)
    common.lr_schedule(learning_rate, FLAGS.steps_per_epoch)  # schedule flags checked now
    model_dir_default = common.default_model_dir(lm_common.MODEL_DIR_PREFIX)
    backup_dir = FLAGS.backup_dir or os.path.join(model_dir_default, "backup")
    finished = training.settle_finished_run(
        model_dir_default, backup_dir, strategy, FLAGS.retrain,
        artifacts=(generate.MODEL_FILE, generate.VOCABULARY_FILE))
    if finished is not None:
        print(f"{model_dir_default} holds a finished run (validation loss "
              f"{finished.get('validation_loss', float('nan')):.4f} in metrics.json): not "
              "training again; pass --retrain (or another --model_dir) to train again")
        return
    settings = lm_common.model_settings(splits.vocab.size)
    description = lm_common.model_description(settings, length)
    lm_common.check_resumable(model_dir_default, backup_dir, description)
    samples = None
    for warning in precision.precision_advice(precision_name):
        print(f"warning: {warning}")
    policy = "float32" if precision_name == "auto" else precision_name
    _prepare_keras3()
    precision.set_precision(policy)
    with strategy.scope():
        model = lm_common.build_language_model(splits.vocab.size, length=length)
    flavour = flavour_of(model)
    if flavour == "keras3":
        with strategy.scope():  # float32 logits (a --model_fn's too); KerasHub's keep their class
            model = precision.apply_precision(model, policy)
    # --parallel: the stages on devices; --recompute stays per block, inside the stages
    model = parallel_flags.staged_model(model, recompute=False)
    model_dir, logdir = common.run_dirs(strategy, lm_common.MODEL_DIR_PREFIX)
    io.write_json(os.path.join(model_dir, lm_common.MODEL_CONFIG_FILE), description)
    train_logdir = os.path.join(logdir, "train")
    print(f"{splits.source}: {splits.num_characters:,} characters, {splits.vocab.kind} "
          f"vocabulary of {splits.vocab.size}, {len(splits.train):,} training and "
          f"{len(splits.validation):,} validation tokens; {lm_common.model_headline(settings)}"
          f" ({flavour}): {model.count_params():,} parameters")
    print(f"strategy {FLAGS.strategy}: {distribute.describe(strategy)}; global batch "
          f"{FLAGS.batch_size} = {per_replica_batch} per replica x {replicas} replica(s) of "
          f"{length} tokens; learning rate {learning_rate:g}")

    # --- Data, precision/XLA trials if asked, compile.
    data_epoch = resume.EpochCounter()  # epoch k's windows are the same after a resume
    inputs = lm_common.lm_inputs(splits, length, strategy, epoch=data_epoch.epoch, model=model)
    schedule = common.lr_schedule(learning_rate, inputs.steps_per_epoch)  # per update
    model, policy, jit_compile, choice = common.auto_precision(  # timed trials, if asked
        model, inputs.train, strategy, precision_name, policy, jit_compile,
        lm_common.compile_from_flags, learning_rate, inputs.steps_per_epoch, replicas)
    with strategy.scope():
        lm_common.compile_from_flags(model, schedule, policy, jit_compile, FLAGS.grad_accum_steps)
    unsplit = getattr(model, "placed", model)  # --parallel: the functional model (same weights)

    # --- Train, logging to TensorBoard.
    common.write_run_config(model_dir, train_logdir)
    if FLAGS.parallel != "none":
        parallel_flags.write_stage_table(model, train_logdir)
    summaries.write_text(train_logdir, "model/config", summaries.markdown_table(
        [{"setting": k, "value": v} for k, v in settings.items()]
        + [{"setting": "parameters", "value": model.count_params()},
           {"setting": "tokenizer", "value": splits.vocab.kind},
           {"setting": "sequence_length", "value": length}]))
    if choice is not None:
        summaries.write_text(train_logdir, "performance/auto_precision",
                             summaries.markdown_table(list(choice.table)))
    if FLAGS.plan:
        result = lm_common.memory_plan(unsplit, per_replica_batch, policy, replicas, length)
        print("memory plan:\n" + plan.write_plan(train_logdir, result,
                                                 path=os.path.join(model_dir, "memory_plan.png")))
    extra = [language_model.LanguageModelMetrics(length, unit)]
    if FLAGS.sample_tokens:
        samples = language_model.SampleLogger(train_logdir, splits.vocab, FLAGS.prompt,
                                              FLAGS.sample_tokens, seed=FLAGS.seed)
        extra.append(samples)
    if FLAGS.profile_steps:
        extra.append(step_profile.ProfileSteps(train_logdir, *common.int_list(FLAGS.profile_steps)))
    flops = common.model_flops(unsplit, policy, sequence_length=length)  # per window
    fit_callbacks = common.fit_callbacks(model_dir, logdir, backup_dir, backup_freq, data_epoch,
                                         extra=extra, flops=flops, flavour=flavour,
                                         batch_size=inputs.fit_batch)
    start = time.perf_counter()
    history = model.fit(inputs.train, validation_data=inputs.validation, epochs=FLAGS.epochs,
                        shuffle=False,
                        steps_per_epoch=inputs.fit_steps,
                        callbacks=fit_callbacks.callbacks, verbose=2)
    train_seconds = time.perf_counter() - start

    # --- Evaluate, export (the model without recomputation, in float32 for TFLite), report.
    validation = training.evaluate(model, inputs.validation)
    exported = precision.apply_precision(
        unsplit if flavour == "keras3" else gpt.with_recompute(unsplit, False), "float32")
    exports = generate.export_language_model(exported, splits.vocab, model_dir)
    rows = [{"model": "keras", "precision": policy, **lm_common.lm_row(validation["loss"], unit),
             "size_mb": None}]
    if FLAGS.tflite and distribute.is_chief(strategy):
        rows += lm_common.tflite_rows(exported, splits.validation, length, model_dir, unit)
        summaries.write_text(train_logdir, "export/validation_loss",
                             summaries.markdown_table(rows))
        print(f"validation loss by export:\n{summaries.markdown_table(rows)}")
    throughput = fit_callbacks.throughput
    backup = fit_callbacks.backup
    tokens_per_sec = (throughput.history[-1]["examples_per_sec"] * length
                      if throughput.history else None)
    sample = (generate.generate(unsplit, splits.vocab, FLAGS.prompt, FLAGS.sample_tokens,
                                temperature=0.8, seed=FLAGS.seed) if FLAGS.sample_tokens else "")
    metrics = {
        "dataset": FLAGS.dataset, "source": splits.source, "tokenizer": splits.vocab.kind,
        "vocabulary_size": splits.vocab.size, "model": settings, "keras": flavour,
        "parameters": int(model.count_params()), "sequence_length": length,
        "epochs": FLAGS.epochs, "steps_per_epoch": FLAGS.steps_per_epoch,
        "batch_size": FLAGS.batch_size, "per_replica_batch_size": per_replica_batch,
        "steps": int(model.optimizer.iterations.numpy()),  # updates (Keras 3 accumulating too)
        "validation_loss": validation["loss"],
        f"validation_bits_per_{unit}": rows[0][f"bits_per_{unit}"],
        "validation_perplexity": rows[0]["perplexity"],
        "validation_accuracy": validation["accuracy"],
        "train_loss": float(history.history["loss"][-1]) if history.history.get("loss") else None,
        "train_seconds": train_seconds, "tokens_per_sec": tokens_per_sec,
        **common.utilization_metrics(throughput, flops),
        "exports": exports, "export_validation": rows, "precision": policy,
        "jit_compile": jit_compile, "grad_accum_steps": FLAGS.grad_accum_steps,
        "recompute": FLAGS.recompute, "learning_rate": learning_rate, "ema": FLAGS.ema,
        "distribution": distribute.describe(strategy),
        "resumed_at_epoch": backup[-1].resumed_at[0] if backup[-1].resumed_at else None,
        "parallel": FLAGS.parallel,
        "stages": model.plan.to_json() if FLAGS.parallel != "none" else None,
        "prompt": FLAGS.prompt, "sample": sample,
        "samples_per_epoch": samples.samples if samples else [],
    }
    io.write_json(os.path.join(model_dir, "metrics.json"), metrics)  # last: the run finished
    if distribute.is_chief(strategy):
        resume.remove_backup(backup_dir)
    print(f"\n{common.model_label()} on {splits.source}: validation loss "
          f"{validation['loss']:.4f} nats/{unit} "
          f"({rows[0][f'bits_per_{unit}']:.3f} bits, perplexity {rows[0]['perplexity']:.2f}) "
          f"after {metrics['steps']} steps in {train_seconds:.1f}s"
          + (f", {tokens_per_sec:,.0f} tokens/s" if tokens_per_sec else ""))
    if sample:
        print(f"sample: {FLAGS.prompt + sample!r}")
    common.print_utilization(metrics)
    print(f"wrote {model_dir}: model.keras, vocabulary.json, metrics.json, checkpoints/, logs/")
    print(f"inspect: {summaries.tensorboard_command(logdir)}")


def _prepare_keras3():
    """For a Keras 3 model (--model=gpt2, --model_fn): Keras 3 imported before the precision
    policy is set (so that its policy is set too) and seeded with --seed."""
    if lm_common.is_keras3_model():
        from tfaccel.keras import keras3

        keras3().utils.set_random_seed(FLAGS.seed)


if __name__ == "__main__":
    lm_common.run(main)
