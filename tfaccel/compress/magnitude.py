"""Magnitude pruning of any Keras model (tf_keras or Keras 3, custom layers too), without TF-MOT.

TF-MOT wraps each layer it prunes, so it needs tf_keras and layers it knows.
Here the model is never wrapped, copied or translated: `prune_magnitude` finds
the kernels (`tfaccel.compress.prunable`: Dense, EinsumDense, convolutions,
embeddings, inside custom layers too, and whatever a layer's
`get_prunable_weights()` returns) and returns a callback that keeps them pruned
while the model trains with its own `fit`. A KerasHub model stays the same
class, with its `generate()`.

The schedules are TF-MOT's, computed the same way (`PolynomialDecay`,
`ConstantSparsity`: same arguments, same float32 arithmetic), and so is the
mask: at a step where the schedule prunes, each kernel keeps its
round(size * (1 - sparsity)) largest magnitudes (at least one), ties at the
threshold kept. The step is the one TF-MOT would count: the schedule's step s
is the s-th training batch, whose mask is computed from the weights the
(s-1)-th optimizer step left, before that batch runs. So for the same model,
schedule and data, each kernel ends with the same number of zeros as with
TF-MOT. Two differences: the mask is applied right after each optimizer step
(TF-MOT applies it before the next forward pass and at epoch ends), so the
weights hold their zeros at every batch end; and a 2:4 (`m_by_n`) mask is
recomputed at each of the schedule's pruning steps (TF-MOT computes it once,
at step 1), along the kernel's input axis.

The pruning step is the optimizer's step count since pruning began
(`optimizer.iterations`, which `.keras` files and `BackupAndRestore` save),
and the masks are the zeros in the kernels: a run restored from a backup goes
on where it stopped with nothing else saved.

Example:

    import keras_hub, numpy as np
    from tfaccel.compress import magnitude, sparsity
    from tfaccel.keras import keras3

    keras = keras3()

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=100, num_layers=2, num_heads=4, hidden_dim=128,
        intermediate_dim=512, max_sequence_length=64)
    lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    lm.compile(optimizer=keras.optimizers.Adam(1e-3),
               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _, callbacks = magnitude.prune_magnitude(lm, 0.5, end_step=8, frequency=2)
    tokens = np.random.default_rng(0).integers(1, 100, (64, 33))
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((64, 32), bool)}
    lm.fit(x, tokens[:, 1:], batch_size=16, epochs=3, callbacks=callbacks, verbose=0)
    magnitude.strip_magnitude(lm)        # masks baked in; still a GPT2CausalLM
    sparsity.sparsity_report(lm)["pruned"]["sparsity"]           # 0.5
"""

import numbers
import weakref

import numpy as np
import tensorflow as tf
from absl import logging

from tfaccel.compress import prunable
from tfaccel.compress.pruning_plan import check_sparsity
from tfaccel.compress.sparsity import SparsityLogger
from tfaccel.errors import ConfigError
from tfaccel.keras import keras

# ---------------------------------------------------------------- schedules


def _check_step(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ConfigError(f"{name}={value!r} must be a step number >= 0")
    return int(value)


def _check_steps(begin_step, end_step, frequency, open_end):
    begin = _check_step(begin_step, "begin_step")
    if open_end and end_step == -1:
        end = -1
    else:
        if end_step is None:
            raise ConfigError("end_step is missing: a ramp needs the step where it reaches "
                              "final_sparsity (or use schedule='constant')")
        end = _check_step(end_step, "end_step")
        if end < begin:
            raise ConfigError(f"end_step={end} is before begin_step={begin}: pruning must end "
                              "after it begins")
        if end == begin and not open_end:
            raise ConfigError(f"end_step={end} equals begin_step: a ramp needs at least one "
                              "step (or use schedule='constant' to prune at once)")
    if isinstance(frequency, bool) or not isinstance(frequency, numbers.Integral) or \
            frequency < 1:
        raise ConfigError(f"frequency={frequency!r} must be a positive number of steps")
    return begin, end, int(frequency)


class _Schedule:
    """When to prune and to what sparsity: `schedule(step) -> (prune now?, sparsity)`."""

    begin_step = end_step = frequency = 0

    def should_prune(self, step):
        """TF-MOT's rule: in [begin_step, end_step] (end -1: forever), every `frequency` steps."""
        in_range = step >= self.begin_step and (self.end_step < 0 or step <= self.end_step)
        return in_range and (step - self.begin_step) % self.frequency == 0

    def last_update(self, after, upto):
        """The last step in (after, upto] where the schedule prunes, or None."""
        high = upto if self.end_step < 0 else min(upto, self.end_step)
        if high < self.begin_step:
            return None
        step = high - (high - self.begin_step) % self.frequency
        return step if step > after else None

    def __call__(self, step):
        return self.should_prune(int(step)), self.sparsity(int(step))

    def get_config(self):
        return {"class_name": type(self).__name__, "config": dict(vars(self))}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class PolynomialDecay(_Schedule):
    """TF-MOT's `PolynomialDecay`, without TF-MOT: the same arguments, the same float32 values.

    sparsity(step) = final + (initial - final) * (1 - p) ** power, with
    p = clip((step - begin_step) / (end_step - begin_step), 0, 1); masks are
    recomputed every `frequency` steps from `begin_step` to `end_step`.

    Example:

        PolynomialDecay(0.0, 0.8, begin_step=0, end_step=100, frequency=10)(50)
        # (True, 0.7)
    """

    def __init__(self, initial_sparsity, final_sparsity, begin_step, end_step, power=3,
                 frequency=100):
        self.initial_sparsity = check_sparsity(initial_sparsity, "initial_sparsity")
        self.final_sparsity = check_sparsity(final_sparsity, "final_sparsity")
        if self.initial_sparsity > self.final_sparsity:
            raise ConfigError(f"initial_sparsity={initial_sparsity:g} is above final_sparsity="
                              f"{final_sparsity:g}: a ramp goes up to the target")
        if isinstance(power, bool) or not isinstance(power, numbers.Real) or power <= 0:
            raise ConfigError(f"power={power!r} must be a positive number, e.g. 3")
        self.power = power
        self.begin_step, self.end_step, self.frequency = _check_steps(
            begin_step, end_step, frequency, open_end=False)

    def sparsity(self, step):
        # TF-MOT's ops in TF-MOT's order, so that round(size * (1 - sparsity)) agrees to the bit.
        p = tf.math.minimum(1.0, tf.math.maximum(0.0, tf.math.divide(
            tf.cast(tf.constant(step, tf.int64) - self.begin_step, tf.float32),
            self.end_step - self.begin_step)))
        value = tf.math.add(tf.math.multiply(self.initial_sparsity - self.final_sparsity,
                                             tf.math.pow(1 - p, self.power)),
                            self.final_sparsity)
        return np.float32(value.numpy())


class ConstantSparsity(_Schedule):
    """TF-MOT's `ConstantSparsity`: `target_sparsity` every `frequency` steps from `begin_step`
    (to `end_step`, -1 for the whole training)."""

    def __init__(self, target_sparsity, begin_step, end_step=-1, frequency=100):
        self.target_sparsity = check_sparsity(target_sparsity, "target_sparsity")
        self.begin_step, self.end_step, self.frequency = _check_steps(
            begin_step, end_step, frequency, open_end=True)

    def sparsity(self, step):
        del step
        return np.float32(self.target_sparsity)


def schedule_from(schedule):
    """A native schedule from one, from TF-MOT's `PolynomialDecay`/`ConstantSparsity` (read
    through their public `get_config`) or from such a config dict."""
    if isinstance(schedule, _Schedule):
        return schedule
    config = schedule.get_config() if hasattr(schedule, "get_config") else schedule
    kinds = {"PolynomialDecay": PolynomialDecay, "ConstantSparsity": ConstantSparsity}
    if not isinstance(config, dict) or config.get("class_name") not in kinds:
        raise ConfigError(f"schedule={schedule!r:.80}: use 'polynomial', 'constant', a "
                          "PolynomialDecay or a ConstantSparsity")
    return kinds[config["class_name"]](**config["config"])


# ---------------------------------------------------------------- masks


def _read(variable):
    """A variable of either Keras as a tensor (float32 master weights under mixed precision)."""
    return tf.convert_to_tensor(variable)


def kept_count(size, sparsity):
    """How many weights of `size` TF-MOT keeps at `sparsity`: round(size * (1 - sparsity)) in
    float32 (half to even), at least one."""
    kept = tf.math.round(tf.cast(size, tf.float32) * (1 - tf.constant(sparsity, tf.float32)))
    return max(int(kept.numpy()), 1)


def magnitude_mask(weights, sparsity):
    """TF-MOT's element-wise mask: the `kept_count` largest magnitudes kept, and every weight
    tied with the smallest of them.

    TF-MOT sorts all the weights (`top_k` of the whole size) for the k-th largest
    magnitude; a partial sort finds the same value, so the same mask (GPT-2 small's 73
    kernels, 124M weights: 2.3 s instead of 26 s on 2 shared cores). Compared in float32,
    which holds float16 and bfloat16 values exactly.
    """
    value = tf.convert_to_tensor(weights)
    magnitudes = np.abs(np.asarray(value.numpy(), dtype=np.float32))
    size = magnitudes.size
    k = kept_count(size, sparsity)
    threshold = np.partition(magnitudes.reshape(-1), size - k)[size - k]
    return tf.cast(tf.constant(magnitudes >= threshold), value.dtype)


def m_by_n_mask(weights, m_by_n, axis):
    """At least m zeros in every n consecutive weights along `axis` (the n - m largest kept)."""
    m, n = m_by_n
    abs_weights = tf.math.abs(tf.convert_to_tensor(weights))
    rank = len(abs_weights.shape)
    axis %= rank
    perm = [d for d in range(rank) if d != axis] + [axis]
    moved = tf.transpose(abs_weights, perm)
    _, top = tf.math.top_k(tf.reshape(moved, [-1, n]), k=n - m)
    keep = tf.reduce_sum(tf.one_hot(top, n, dtype=abs_weights.dtype), axis=-2)
    return tf.transpose(tf.reshape(keep, tf.shape(moved)), np.argsort(perm))


# ---------------------------------------------------------------- the callback


class MagnitudePruning(keras.callbacks.Callback):
    """Keeps a model's planned kernels pruned to a schedule while it trains (either Keras).

    Made by `prune_magnitude`; pass it to `fit`. At each batch end (after the
    optimizer step) it recomputes the masks when the schedule prunes at the
    next step, then zeroes the pruned weights.

    Attributes:
      plan: the `prunable.KernelPlan` (the kernels pruned, the others and why).
      schedule: a `PolynomialDecay` or `ConstantSparsity`.
      m_by_n: None or (m, n).
      step: pruning steps done (optimizer steps since pruning began); None before `fit`.
      updates: [(step, sparsity)] of each mask update in this process.
    """

    def __init__(self, model, plan, schedule, m_by_n=None, start_step=None):
        super().__init__()
        self.plan, self.schedule, self.m_by_n = plan, schedule, m_by_n
        self.step, self.updates = None, []
        self.start_step = None if start_step is None else _check_step(start_step, "start_step")
        self.pruned_model = weakref.ref(model)
        optimizer = getattr(model, "optimizer", None)
        # A model pruned while its optimizer has already stepped counts from that step.
        self.optimizer_at_start = (optimizer, int(optimizer.iterations.numpy())) \
            if optimizer is not None else None
        self.masks = None
        self.considered = None

    def optimizer_steps(self):
        """Optimizer steps since pruning began (the schedule's clock)."""
        optimizer = self.model.optimizer
        start = self.start_step
        if start is None:
            known, at = self.optimizer_at_start or (None, 0)
            start = at if known is optimizer else 0
        return int(optimizer.iterations.numpy()) - start

    def target(self):
        """The schedule's sparsity at the current step (m/n for a 2:4-like pattern)."""
        if self.m_by_n:
            return self.m_by_n[0] / self.m_by_n[1]
        return float(self.schedule.sparsity(max(self.step or 0, 0)))

    def on_train_batch_begin(self, batch, logs=None):
        if self.masks is None:
            self.start()

    def on_train_batch_end(self, batch, logs=None):
        self.advance(self.optimizer_steps())

    def start(self):
        """Takes the masks from the zeros in the kernels (none yet, or those a restored run
        left) and prunes for the first step to train."""
        if self.model is not self.pruned_model():
            raise ConfigError(f"these callbacks prune another model than {self.model.name!r}: "
                              f"fit that model with them, or call prune_magnitude on this one")
        prunable.register_pruning(self.model, self)  # again, if it was stripped in between
        self.masks = {}
        for k in self.plan.kernels:
            value = _read(k.variable)
            zeros = tf.math.equal(value, 0)
            self.masks[k.key] = tf.cast(tf.math.logical_not(zeros), value.dtype) \
                if bool(tf.reduce_any(zeros)) else None
        done = self.optimizer_steps()
        if done < 0:
            raise ConfigError(f"the optimizer is at step {done + (self.start_step or 0)}, "
                              f"before start_step={self.start_step}: pass the optimizer step "
                              "pruning began at")
        self.considered = done
        self.advance(done)

    def advance(self, done):
        """After `done` optimizer steps: update the masks if the schedule prunes at a step up
        to the next one (TF-MOT prunes at step s before the s-th batch), then apply them."""
        self.step = done
        due = self.schedule.last_update(self.considered, done + 1)
        self.considered = max(self.considered, done + 1)
        if due is not None:
            sparsity = self.schedule.sparsity(due)
            for k in self.plan.kernels:
                value = _read(k.variable)
                self.masks[k.key] = m_by_n_mask(value, self.m_by_n, k.axis) if self.m_by_n \
                    else magnitude_mask(value, sparsity)
            self.updates.append((due, float(sparsity)))
        self.apply_masks()

    def apply_masks(self):
        """Zeroes the pruned weights now."""
        for k in self.plan.kernels:
            mask = (self.masks or {}).get(k.key)
            if mask is not None:
                k.variable.assign(_read(k.variable) * mask)


# ---------------------------------------------------------------- the entry points


def prune_magnitude(model, final_sparsity=None, *, schedule="polynomial", begin_step=0,
                    end_step=None, frequency=100, initial_sparsity=0.0, power=3, m_by_n=None,
                    include=(), exclude=(), kernels=None, min_weights=0, keep_first_conv=False,
                    start_step=None, logdir=None):
    """Prunes `model`'s kernels by magnitude while it trains: any Keras 3 or tf_keras model.

    Finds the kernels (`prunable.plan_kernels`, custom layers included), checks
    everything, and returns the callbacks to pass to `fit`. The model itself is
    pruned in place (never wrapped or copied: its class, methods and saving stay
    as they were); compile it before or after, in the scope you train in.

    Example:

        model, callbacks = prune_magnitude(model, 0.8, end_step=300, frequency=20)
        model.fit(train_ds, epochs=4, callbacks=callbacks)     # 100 steps per epoch
        strip_magnitude(model)

    A custom layer that holds its own kernels (not Dense/EinsumDense/Conv/Embedding
    sublayers) opts in with a `get_prunable_weights()` method returning them, or
    the caller passes them: `prune_magnitude(model, 0.5, end_step=50,
    kernels=[layer.w])`.

    Args:
      model: a built tf_keras or Keras 3 model.
      final_sparsity: share of zeros each pruned kernel reaches, in [0, 1)
        (with `m_by_n`: leave it out, the pattern sets m/n).
      schedule: 'polynomial' (TF-MOT's PolynomialDecay from `initial_sparsity` at
        `begin_step` to `final_sparsity` at `end_step`, `power`), 'constant'
        (ConstantSparsity: `final_sparsity` from `begin_step` to `end_step`, -1 for
        ever), or a `PolynomialDecay`/`ConstantSparsity` (this module's or TF-MOT's;
        then give no sparsity or step arguments).
      begin_step, end_step, frequency, initial_sparsity, power: the schedule's
        (TF-MOT's meaning: masks are recomputed every `frequency` steps from
        `begin_step` to `end_step`).
      m_by_n: e.g. (2, 4): at least m zeros in every n consecutive weights along
        each kernel's input axis (Dense, Conv: input channels; EinsumDense: its
        last contracted axis); kernels without one, or whose input axis n does not
        divide, stay dense and are listed in the plan.
      include, exclude, kernels, min_weights, keep_first_conv: which kernels
        (see `prunable.plan_kernels`).
      start_step: the optimizer step pruning begins at; default the optimizer's
        step now if `model` is compiled, else 0 (pass 0 for a compiled model
        loaded from a file saved mid-pruning).
      logdir: if given, per-layer sparsity goes to TensorBoard there each epoch.

    Returns:
      (model, callbacks): `model` itself, and [MagnitudePruning] (+ SparsityLogger).

    Raises:
      ConfigError: a bad sparsity, step, frequency, pattern or name; nothing to prune.
      UnsupportedLayerError: a kernel named in include/kernels cannot take the pattern.
    """
    m_by_n = prunable.check_m_by_n(m_by_n)
    if m_by_n is not None:
        pattern = m_by_n[0] / m_by_n[1]
        if final_sparsity is not None and abs(final_sparsity - pattern) > 1e-9:
            raise ConfigError(f"m_by_n={m_by_n} sets the sparsity to {pattern:g}, not "
                              f"final_sparsity={final_sparsity!r}: leave final_sparsity out")
        final_sparsity = pattern
    if isinstance(schedule, str):
        if final_sparsity is None:
            raise ConfigError("final_sparsity is missing: give the share of zeros to reach, "
                              "e.g. 0.8")
        if schedule == "polynomial":
            schedule = PolynomialDecay(initial_sparsity, final_sparsity, begin_step, end_step,
                                       power, frequency)
        elif schedule == "constant":
            schedule = ConstantSparsity(final_sparsity, begin_step,
                                        -1 if end_step is None else end_step, frequency)
        else:
            raise ConfigError(f"schedule={schedule!r}: use 'polynomial', 'constant', a "
                              "PolynomialDecay or a ConstantSparsity")
    else:
        if (final_sparsity is not None and m_by_n is None) or end_step is not None or \
                begin_step != 0 or frequency != 100 or initial_sparsity != 0.0 or power != 3:
            raise ConfigError("a schedule object carries its own sparsity and steps: leave "
                              "final_sparsity, begin_step, end_step, frequency, "
                              "initial_sparsity and power out")
        schedule = schedule_from(schedule)
    plan = prunable.plan_kernels(model, include=include, exclude=exclude, kernels=kernels,
                                 min_weights=min_weights, keep_first_conv=keep_first_conv,
                                 m_by_n=m_by_n)
    for key, reason in plan.skipped.items():
        log = logging.warning if key in plan.unfit else logging.info
        log("magnitude pruning leaves %s dense: %s", key, reason)
    pruning = MagnitudePruning(model, plan, schedule, m_by_n, start_step)
    prunable.register_pruning(model, pruning)
    logging.info("pruning %s by magnitude (%s): %s", model.name, schedule,
                 ", ".join(k.key for k in plan.kernels))
    callbacks = [pruning]
    if logdir:
        callbacks.append(SparsityLogger(logdir))
    return model, callbacks


def strip_magnitude(model):
    """`model` with its final masks baked into the weights and no pruning state left.

    The model was never wrapped, so this returns the same object: the pruned
    weights are zero (they already are after every training batch), and the
    model no longer counts as being pruned (`prunable.active_pruning` is None).

    Example:

        small = strip_magnitude(model)      # small is model
    """
    pruning = prunable.active_pruning(model)
    if pruning is not None:
        pruning.apply_masks()
        pruning.masks = None
        prunable.end_pruning(model)
    return model
