"""A memory plan checked by running the step: peaks measured at two small batches, fit, scaled.

`measure_memory(model, settings)` starts a fresh Python process (an allocator that has
served nothing else) with TensorFlow's pooled host allocator
(`memory.use_pooled_host_allocator`), builds the model there, and runs a few training
steps (forward, a loss, gradients, the optimizer's update) at two small batch sizes,
reading the allocator's peak each time (`memory.training_peak_bytes`). The two peaks
fit ``fixed + per_example * batch``; the fit predicts the target batch.

Which to trust when: the measured prediction includes what the graph cannot see
(oneDNN's AVX2 convolution workspaces, the order TensorFlow runs independent ops in,
the allocator's rounding), so on this machine it is the better number; the graph's
(`tfaccel.performance.memory_graph`) is the one that transfers to another device (it
counts tensors, not one backend's buffers) and costs no run. They disagree most on
convolutions on CPUs without AVX-512 (oneDNN's AVX2 kernels keep large workspaces).
Under gradient accumulation the step runs one micro-batch; the accumulator (float32,
one per trainable weight) is added.

Example:

    from tfaccel.performance import calibrate, plan

    c = calibrate.measure_memory("cnn", plan.PlanSettings(batch_size=512),
                                 input_shape=(8, 8, 1), num_classes=10)
    print(c.predicted, c.peaks)
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

from tfaccel.errors import ConfigError, ModelError

CALIBRATION_BATCHES = (8, 16)
"""The two batch sizes a calibration runs (their difference gives the per-example part)."""
_TIMEOUT_S = 900


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Measured peaks ({batch: bytes}), their fit, and its prediction at the target batch."""

    peaks: dict
    per_example: float
    fixed: int
    batch_size: int
    predicted: int
    method: str = "measured (peaks of two small batches in a fresh process, fit and scaled)"


def _source(model, tmpdir):
    """What the child process builds: a zoo name or a file as given, a model saved to
    `tmpdir`."""
    if isinstance(model, str):
        return model
    path = os.path.join(tmpdir, "model.keras")
    try:
        model.save(path)
    except Exception as e:  # savers raise many types for a model they cannot write
        raise ModelError(f"cannot save {model.name!r} to measure it in a fresh process "
                         f"({str(e).splitlines()[0] if str(e) else type(e).__name__}): "
                         "pass a .keras file or a zoo name") from None
    return path


def measure_memory(model, settings, input_shape=None, num_classes=None, sequence_length=None,
                   batches=CALIBRATION_BATCHES, steps=3):
    """Measures `model` training under `settings` in a fresh process; returns a `Calibration`.

    Args:
      model: a zoo name (with `input_shape`, `num_classes`), a .keras/.h5 file, or a built
        model (saved to a temporary .keras file for the child).
      settings: a checked `plan.PlanSettings` (batch, precision, optimizer, accumulation).
      sequence_length: the length of a variable-length input.
      batches: the two batch sizes measured.

    Raises:
      ConfigError: bad batches; ModelError: the child failed (its last error line).
    """
    small, large = (int(b) for b in batches)
    if not 0 < small < large:
        raise ConfigError(f"batches={batches}: two increasing positive batch sizes")
    with tempfile.TemporaryDirectory() as tmpdir:
        spec = {"model": _source(model, tmpdir), "input_shape": input_shape,
                "num_classes": num_classes, "precision": settings.precision,
                "optimizer": settings.optimizer, "sequence_length": sequence_length,
                "batches": [small, large], "steps": int(steps)}
        proc = subprocess.run([sys.executable, "-m", "tfaccel.performance.calibrate",
                               json.dumps(spec)], capture_output=True, text=True, check=False,
                              timeout=_TIMEOUT_S, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEAKS ")]
    if proc.returncode or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(f"measuring {spec['model']!r} failed: {last}")
    read = json.loads(lines[-1][len("PEAKS "):])
    trainable = read.pop("trainable")
    peaks = {int(b): int(p) for b, p in read.items()}
    # A smaller peak at the larger batch is the peaks' own spread (the order TensorFlow runs
    # ops in) hiding a batch's small cost: no per-example part, the larger peak is fixed.
    per_example = max(0.0, (peaks[large] - peaks[small]) / (large - small))
    fixed = int(round(max(peaks.values()) - large * per_example))
    micro = max(1, settings.batch_size // settings.grad_accum_steps)
    accumulator = 0
    if settings.grad_accum_steps > 1:
        accumulator = 4 * trainable
    predicted = int(round(fixed + per_example * micro)) + accumulator
    return Calibration(peaks, per_example, fixed, settings.batch_size, predicted)


def _optimizer(name, model):
    """`name` (`plan.SLOTS`) as an optimizer of `model`'s Keras."""
    # deferred: TensorFlow (only the child process trains)
    from tfaccel.keras import keras_of

    optimizers = keras_of(model).optimizers
    if name == "momentum":
        return optimizers.SGD(1e-3, momentum=0.9)
    return {"sgd": optimizers.SGD, "adam": optimizers.Adam, "adamw": optimizers.AdamW,
            "rmsprop": optimizers.RMSprop}[name](1e-3)


def _child(spec):
    """In the fresh process: {batch: peak bytes} of `spec`'s model trained at each batch."""
    from tfaccel.performance import memory  # deferred: TensorFlow, after the allocator is set

    memory.use_pooled_host_allocator()
    import tensorflow as tf  # deferred: TensorFlow

    from tfaccel.keras import input_specs, is_keras3_object  # deferred: TensorFlow
    from tfaccel.performance import memory_profile, utilization  # deferred: TensorFlow
    from tfaccel.train import precision as precisions  # deferred: TensorFlow

    model = memory_profile.built_model(spec["model"], spec["input_shape"],
                                       spec["num_classes"], spec["precision"])
    opt = precisions.wrap_optimizer(_optimizer(spec["optimizer"], model), spec["precision"])
    variables = model.trainable_variables
    structure = getattr(model, "input", None)

    @tf.function(autograph=False)
    def train(*inputs):
        with tf.GradientTape() as tape:
            loss = utilization.summed_outputs(model, structure, inputs,
                                              lambda t: tf.reduce_mean(tf.square(t)))
        grads = tape.gradient(loss, [getattr(v, "value", v) for v in variables]
                              if is_keras3_object(model) else variables)
        opt.apply_gradients(zip(grads, variables))
        return loss

    peaks = {}
    for batch in spec["batches"]:
        data = [tf.ones(s.shape, s.dtype) if s.dtype.is_integer or s.dtype == tf.bool
                else tf.random.normal(s.shape, dtype=s.dtype)
                for s in input_specs(model, batch, spec["sequence_length"])]
        peaks[batch] = memory.training_peak_bytes(lambda d=data: train(*d), steps=spec["steps"])
        del data
    peaks["trainable"] = sum(int(v.shape.num_elements()) for v in model.trainable_weights)
    return peaks


if __name__ == "__main__":
    print("PEAKS " + json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
