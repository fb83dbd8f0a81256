"""Train a classifier on a dataset and write everything worth inspecting.

    python recipes/train.py                          # CNN on the bundled digits
    python recipes/train.py --flagfile=recipes/presets/digits_cnn.cfg
    tensorboard --logdir runs/digits-cnn/logs

Writes to --model_dir: TensorBoard logs (logs/train, logs/validation: loss,
accuracy, learning rate, examples/sec, and the run's flags as text),
checkpoints/, the final model (model.keras and saved_model/), flags.cfg (the
flags to rerun it) and metrics.json with the test accuracy.
"""

import os
import time

import common
from absl import flags

FLAGS = flags.FLAGS
common.define_data_flags()
common.define_model_flags()
common.define_train_flags()


def main(argv):
    common.reject_extra_args(argv)
    from tfaccel import data, io, summaries, training
    from tfaccel.keras import keras

    # --- Inputs: everything that can be wrong is checked before anything is written.
    keras.utils.set_random_seed(FLAGS.seed)
    splits = common.load_data()
    model = common.load_model(splits.info)
    model_dir = common.default_model_dir()
    logdir = os.path.join(model_dir, "logs")

    # --- Model and data.
    optimizer = training.make_optimizer(FLAGS.optimizer, FLAGS.learning_rate)
    training.compile_classifier(model, optimizer)
    train_ds = data.batch_dataset(splits.train, FLAGS.batch_size, training=True, seed=FLAGS.seed)
    val_ds = data.batch_dataset(splits.validation, FLAGS.batch_size, training=False)
    test_ds = data.batch_dataset(splits.test, FLAGS.batch_size, training=False)

    # --- Train, logging to TensorBoard.
    os.makedirs(model_dir, exist_ok=True)
    io.write_text(os.path.join(model_dir, "flags.cfg"), FLAGS.flags_into_string())
    summaries.write_text(os.path.join(logdir, "train"), "config/flags",
                         summaries.markdown_table(common.flag_values())
                         + f"\n\n`{common.command_line()}`")
    throughput = summaries.ThroughputLogger(os.path.join(logdir, "train"), FLAGS.batch_size)
    callbacks = [
        summaries.LearningRateLogger(os.path.join(logdir, "train"), every_n_steps=10),
        throughput,
        keras.callbacks.TensorBoard(logdir, update_freq="epoch"),
        keras.callbacks.ModelCheckpoint(os.path.join(model_dir, "checkpoints", "ckpt-{epoch:03d}.weights.h5"),
                                        save_weights_only=True),
    ]
    start = time.perf_counter()
    history = model.fit(train_ds, validation_data=val_ds, epochs=FLAGS.epochs,
                        callbacks=callbacks, verbose=2)
    train_seconds = time.perf_counter() - start

    # --- Evaluate, export, report.
    test = training.evaluate(model, test_ds)
    exports = training.export_model(model, model_dir)
    metrics = {
        "dataset": FLAGS.dataset,
        "model": common.model_label(),
        "parameters": int(model.count_params()),
        "epochs": FLAGS.epochs,
        "batch_size": FLAGS.batch_size,
        "test_accuracy": test["accuracy"],
        "test_loss": test["loss"],
        "validation_accuracy": float(history.history["val_accuracy"][-1]) if FLAGS.epochs else None,
        "train_seconds": train_seconds,
        "examples_per_sec": throughput.history[-1]["examples_per_sec"] if throughput.history else None,
        "exports": exports,
    }
    io.write_json(os.path.join(model_dir, "metrics.json"), metrics)
    summaries.write_scalars(os.path.join(logdir, "test"),
                            {"test_accuracy": test["accuracy"], "test_loss": test["loss"]},
                            step=FLAGS.epochs)
    print(f"\n{metrics['model']} on {FLAGS.dataset}: test accuracy {test['accuracy']:.4f} "
          f"(loss {test['loss']:.4f}) after {FLAGS.epochs} epochs in {train_seconds:.1f}s")
    print(f"wrote {model_dir}: model.keras, saved_model/, metrics.json, checkpoints/, logs/")
    print(f"inspect: tensorboard --logdir {logdir}")


if __name__ == "__main__":
    common.run(main)
