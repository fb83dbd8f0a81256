"""Is training waiting for its input, or for its computation?

`diagnose_input` measures two rates in examples/s: the input pipeline alone
(iterating the dataset, nothing else) and the train step alone (the compiled
``train_function`` on a few batches held in memory). If the pipeline delivers
fewer examples per second than the step consumes, training is **input-bound**
and the suggestion says what to change in the pipeline; otherwise it is
**compute-bound** and the input side needs nothing. Both rates are the best of
several timed runs after warm-up, so a busy machine lowers them less.

The model's weights, optimizer state and metrics are restored afterwards, so the
check can run right before training.

Example:

    from tfaccel.performance import diagnose

    result = diagnose.diagnose_input(model, train_ds)
    print(result.summary())  # input-bound: pipeline 900 ex/s < train step 5200 ex/s. ...
"""

import dataclasses
import os
import shutil
import tempfile

import tensorflow as tf

from tfaccel import _compat, monitor, summaries
from tfaccel.errors import ConfigError

INPUT_BOUND = "input-bound"
COMPUTE_BOUND = "compute-bound"


@dataclasses.dataclass(frozen=True)
class InputDiagnosis:
    """Both measured rates, the verdict and what to do about it."""

    input_examples_per_sec: float
    step_examples_per_sec: float
    verdict: str
    suggestion: str
    input_runs: tuple = ()
    step_runs: tuple = ()

    @property
    def ratio(self):
        """Input rate over step rate (< 1 means input-bound)."""
        return self.input_examples_per_sec / max(self.step_examples_per_sec, 1e-9)

    def summary(self):
        """One paragraph: verdict, both numbers, the suggestion."""
        sign = "<" if self.verdict == INPUT_BOUND else ">="
        return (f"{self.verdict}: input pipeline {self.input_examples_per_sec:,.0f} examples/s "
                f"{sign} train step {self.step_examples_per_sec:,.0f} examples/s "
                f"(ratio {self.ratio:.2f}). {self.suggestion}")

    def as_dict(self):
        return {**dataclasses.asdict(self), "ratio": self.ratio}


def _batch_size(batch):
    return int(tf.shape(tf.nest.flatten(batch)[0])[0])


def _check_counts(num_batches, warmup, repeats):
    if num_batches < 1 or warmup < 0 or repeats < 1:
        raise ConfigError(f"num_batches={num_batches}, warmup={warmup}, repeats={repeats}: "
                          "need num_batches >= 1, warmup >= 0, repeats >= 1")


def measure_input_throughput(dataset, *, num_batches=20, warmup=3, repeats=3):
    """Examples/s of iterating a batched dataset alone: best of `repeats` fresh iterators.

    Each run starts a new iterator (repeating the dataset if it is short), skips
    `warmup` batches (start-up, shuffle-buffer filling), then times `num_batches`
    (`tfaccel.monitor.time_steps`, a batch a step).

    Returns:
      ``(best_examples_per_sec, all_runs)``.
    """
    _check_counts(num_batches, warmup, repeats)
    runs = []
    for _ in range(repeats):
        iterator, sizes = iter(dataset.repeat()), []
        times = monitor.time_steps(lambda: sizes.append(_batch_size(next(iterator))),
                                   num_batches, warmup)
        runs.append(sum(sizes[warmup:]) / max(sum(times.seconds), 1e-9))
    return max(runs), tuple(runs)


def measure_step_throughput(model, dataset, *, num_steps=20, warmup=3, repeats=3, cached_batches=4,
                            restore=True):
    """Examples/s of the compiled model's train step alone, on batches held in memory.

    The first `cached_batches` batches of `dataset` are cached and repeated, so the
    input costs (almost) nothing; the model's own ``train_function`` runs under its
    distribution strategy. With `restore` the weights, optimizer state (including
    a loss scale) and metrics are put back afterwards.

    Returns:
      ``(best_examples_per_sec, all_runs)``.

    Raises:
      ConfigError: the model is not compiled.
    """
    _check_counts(num_steps, warmup, repeats)
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled_loss", None):
        raise ConfigError(f"model {model.name!r} is not compiled: "
                          "compile it before measuring its train step")
    strategy = model.distribute_strategy
    cached = dataset.take(cached_batches).cache().repeat()
    per_call = _compat.steps_per_execution(model)
    batch = _batch_size(next(iter(dataset.take(1))))
    with _restored(model, enabled=restore):
        with strategy.scope():
            iterator = iter(strategy.experimental_distribute_dataset(cached))
        model.make_train_function()  # Keras 3's returns None: both keep it on the model
        train_function = model.train_function
        calls = max(1, num_steps // per_call)
        for _ in range(max(1, warmup // per_call)):
            train_function(iterator)

        def run():  # `calls` steps, then their results read: the work is done when it returns
            for _ in range(calls):
                logs = train_function(iterator)
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, logs)

        times = monitor.time_steps(run, repeats)
    runs = tuple(calls * per_call * batch / max(s, 1e-9) for s in times.seconds)
    return max(runs), runs


class _restored:
    """Checkpoints model and optimizer (optimizer built first) and restores them on exit."""

    def __init__(self, model, enabled=True):
        self.model, self.enabled = model, enabled

    def __enter__(self):
        if not self.enabled:
            return self
        model = self.model
        with model.distribute_strategy.scope():
            if hasattr(model.optimizer, "build"):
                model.optimizer.build(model.trainable_variables)
        self.counter = _compat.train_counter(model)
        self.counter_value = self.counter.numpy() if self.counter is not None else None
        self.dir = tempfile.mkdtemp(prefix="tfaccel-diagnose-")
        self.ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
        self.path = self.ckpt.write(os.path.join(self.dir, "before"))
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.ckpt.read(self.path).expect_partial()
            if self.counter is not None:
                self.counter.assign(self.counter_value)
            self.model.reset_metrics()
            shutil.rmtree(self.dir, ignore_errors=True)
        return False


def suggest(verdict, config=None, ratio=None):
    """What to do next, given the verdict and the `PipelineConfig` used (if any)."""
    if verdict == COMPUTE_BOUND:
        return ("Nothing to do on the input side: the pipeline keeps up. Speed up the step instead "
                "(a larger batch, mixed precision or XLA on a GPU that supports them, "
                "a smaller model).")
    tips = []
    if config is not None:
        if config.num_parallel_calls not in (tf.data.AUTOTUNE, None):
            tips.append(f"more parallel calls (num_parallel_calls={config.num_parallel_calls}; "
                        "use AUTOTUNE)")
        if config.max_intra_op_parallelism != 1:
            tips.append("one intra-op thread per element (max_intra_op_parallelism=1): parallel "
                        "elements and multi-threaded ops fight over the same cores")
        if config.cache == "none":
            tips.append("caching the decoded examples (cache='memory' or a file path), so epochs "
                        "after the first skip reading and decoding")
        if config.image_size is not None:
            tips.append(f"a smaller decode: store the images nearer {tuple(config.image_size)} "
                        "(resize once, offline) so each epoch decodes fewer pixels")
        if config.random_crop or config.mixup_alpha:
            tips.append("cheaper augmentation, or moving it into the model (Keras preprocessing "
                        "layers run on the accelerator)")
    if not tips:
        tips.append("more parallel calls or CPU cores for the input, caching decoded examples, and "
                    "smaller or pre-resized images")
    gap = f" (the step could take {1 / ratio:.1f}x more)" if ratio else ""
    return "Speed up the input" + gap + ": try " + "; ".join(tips) + "."


def diagnose_input(model, dataset, *, config=None, num_batches=20, warmup=3, repeats=3):
    """Measures the input pipeline and the train step and says which one is the bottleneck.

    Args:
      model: a compiled tf_keras model (weights and optimizer state are restored after).
      dataset: the batched training dataset.
      config: the `PipelineConfig` that built `dataset`, for specific suggestions.
      num_batches: timed batches (and train steps) per run.
      warmup: untimed batches (and steps) before each timing.
      repeats: timed runs; the best counts.

    Returns:
      An `InputDiagnosis`.

    Raises:
      ConfigError: bad counts or an uncompiled model.
    """
    input_rate, input_runs = measure_input_throughput(dataset, num_batches=num_batches,
                                                      warmup=warmup, repeats=repeats)
    step_rate, step_runs = measure_step_throughput(model, dataset, num_steps=num_batches,
                                                   warmup=warmup, repeats=repeats)
    verdict = INPUT_BOUND if input_rate < step_rate else COMPUTE_BOUND
    return InputDiagnosis(input_rate, step_rate, verdict,
                          suggest(verdict, config, input_rate / max(step_rate, 1e-9)),
                          input_runs, step_runs)


def write_diagnosis(logdir, diagnosis, step=0):
    """Writes the diagnosis to TensorBoard: the summary as text, both rates as scalars."""

    summaries.write_text(logdir, "input_diagnosis", diagnosis.summary(), step=step)
    summaries.write_scalars(logdir, {
        "input_diagnosis/input_examples_per_sec": diagnosis.input_examples_per_sec,
        "input_diagnosis/step_examples_per_sec": diagnosis.step_examples_per_sec,
    }, step=step)
