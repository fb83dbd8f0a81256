"""tfaccel.summaries: what is written can be read back with TensorBoard's own reader."""

import pathlib

import numpy as np
import pytest
from conftest import keras_of_flavour

from tfaccel import plots, summaries


def test_text_scalars_and_png_round_trip(tmp_path):
    logdir = str(tmp_path)
    table = summaries.markdown_table([{"variant": "int8", "accuracy": 0.98123}])
    assert table.splitlines()[2] == "| int8 | 0.9812 |"
    summaries.write_text(logdir, "report/table", table)
    summaries.write_scalars(logdir, {"a": 1.5, "b": 2}, step=3)
    fig, ax = plots.new_figure(2, 2)
    ax.plot([0, 1], [1, 0])
    png = plots.save_png(fig, str(tmp_path / "plot.png"))
    summaries.write_png(logdir, "report/plot", png)  # a path
    summaries.write_png(logdir, "report/bytes", plots.png_bytes(fig))  # or the bytes
    assert summaries.read_text_summaries(logdir)["report/table"] == table
    scalars = summaries.read_scalars(logdir)
    assert scalars["a"] == [(3, 1.5)] and scalars["b"] == [(3, 2.0)]
    assert summaries.read_image_tags(logdir) == ["report/bytes", "report/plot"]


def test_read_text_is_deprecated_and_still_reads_tensorboard_text(tmp_path):
    import tfaccel
    from tfaccel.data import text

    summaries.write_text(str(tmp_path / "logs"), "report/table", "| a |")
    (tmp_path / "corpus.txt").write_text("some words")
    # The two readers now have their own names, each saying what it reads.
    assert tfaccel.read_text_summaries is summaries.read_text_summaries
    assert tfaccel.read_corpus is text.read_corpus
    assert tfaccel.read_text_summaries is not tfaccel.read_corpus
    assert tfaccel.read_text_summaries(tmp_path / "logs") == {"report/table": "| a |"}
    assert tfaccel.read_corpus(tmp_path / "corpus.txt") == ("some words",
                                                            str(tmp_path / "corpus.txt"))
    # tfaccel.read_text was the TensorBoard reader (the later of its two exports): it still is,
    # and warns with the name to use.
    with pytest.warns(DeprecationWarning, match=r"tfaccel\.read_text_summaries\(logdir\)"):
        assert tfaccel.read_text(tmp_path / "logs") == {"report/table": "| a |"}
    with pytest.warns(DeprecationWarning, match=r"use read_corpus"):
        assert text.read_text(tmp_path / "corpus.txt") == text.read_corpus(tmp_path / "corpus.txt")


def test_scalar_logger_owns_the_writer(tmp_path):
    logger = summaries.ScalarLogger(tmp_path)
    assert logger.logdir == str(tmp_path)
    logger.on_train_end()  # nothing written yet: nothing to close, no event file
    assert list(tmp_path.iterdir()) == []
    logger.write({"loss": 0.5, "accuracy": 1}, step=1)
    # Each write is flushed: readable while the writer is still open.
    assert summaries.read_scalars(tmp_path) == {"loss": [(1, 0.5)], "accuracy": [(1, 1.0)]}
    logger.write({"loss": 0.25}, step=2, flush=False)
    logger.flush()
    assert summaries.read_scalars(tmp_path)["loss"] == [(1, 0.5), (2, 0.25)]
    logger.on_train_end()
    logger.write({"loss": 0.125}, step=3)  # a second fit opens a new event file
    logger.on_train_end()
    assert summaries.read_scalars(tmp_path)["loss"] == [(1, 0.5), (2, 0.25), (3, 0.125)]


def test_every_scalar_callback_is_a_scalar_logger():
    from tfaccel import monitor
    from tfaccel.compress import sparsity
    from tfaccel.performance import memory

    for callback in (summaries.EpochScalarLogger, summaries.ThroughputLogger,
                     summaries.LearningRateLogger, monitor.HardwareMonitor,
                     memory.PeakMemoryLogger, sparsity.SparsityLogger):
        assert issubclass(callback, summaries.ScalarLogger), callback


def test_callbacks_log_throughput_and_learning_rate(tmp_path, flavour):
    keras = keras_of_flavour(flavour)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    model.compile(keras.optimizers.SGD(schedule), "sparse_categorical_crossentropy")
    x = np.zeros((40, 4), np.float32)
    y = np.zeros((40,), np.int64)
    throughput = summaries.ThroughputLogger(tmp_path, global_batch_size=8,
                                            flops_per_example=1e6, peak_flops=1e10)
    lr = summaries.LearningRateLogger(tmp_path, every_n_steps=2)
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                        callbacks=[throughput, lr, summaries.TensorBoard(tmp_path / "tb")])
    scalars = summaries.read_scalars(str(tmp_path))
    assert [s for s, _ in scalars["epoch_examples_per_sec"]] == [0, 1]
    assert all(v > 0 for _, v in scalars["epoch_examples_per_sec"])
    for (_, rate), (_, mfu), (_, tflops) in zip(scalars["epoch_examples_per_sec"],
                                                scalars["epoch_mfu"],
                                                scalars["epoch_model_tflops_per_sec"]):
        assert mfu == pytest.approx(rate * 1e6 / 1e10, rel=1e-5)
        assert tflops == pytest.approx(rate * 1e6 / 1e12, rel=1e-5)
    # One event per step: epoch ends (steps 5, 10) that fall on a period are not logged twice.
    assert [step for step, _ in scalars["learning_rate"]] == [2, 4, 5, 6, 8, 10]
    logged = dict(scalars["learning_rate"])
    # The one learning-rate curve: Keras's TensorBoard adds none, and none goes to Keras's logs.
    keras_scalars = summaries.read_scalars(str(tmp_path / "tb" / "train"))
    assert "epoch_loss" in keras_scalars
    assert not [t for t in keras_scalars if "lr" in t or "learning_rate" in t], keras_scalars
    assert "lr" not in history.history and "learning_rate" not in history.history
    # Logged at step s: the rate the s-th update used, i.e. the schedule at s - 1.
    for step, value in logged.items():
        assert value == pytest.approx(0.1 * 0.5 ** (step - 1))


def test_tensorboard_command_serves_localhost_only():
    command = summaries.tensorboard_command("runs/my run/logs")
    assert command == "tensorboard --logdir 'runs/my run/logs' --host localhost"
    assert "bind_all" not in command


def test_nothing_in_the_tree_serves_tensorboard_to_the_network():
    root = pathlib.Path(__file__).resolve().parents[1]
    files = [root / "README.md", *root.glob("docs/**/*.md"), *root.glob("recipes/**/*.py"),
             *root.glob("recipes/presets/*.cfg"), *root.glob("tfaccel/**/*.py"),
             *root.glob("benchmarks/**/*.py")]
    exposed = [f"{path.relative_to(root)}:{number}: {line.strip()}"
               for path in files if path.is_file()
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if any(flag in line for flag in ("--bind_all", "--host 0.0.0.0", "--host=0.0.0.0"))]
    assert exposed == []
