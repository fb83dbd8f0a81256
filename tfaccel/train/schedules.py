"""Learning-rate schedules that save and load with a compiled model.

Every schedule is a tf_keras `LearningRateSchedule` registered as serializable
(package ``tfaccel``), so a model compiled with one saves to ``.keras`` or
``.h5`` and loads back with the same learning rate at the same step. Each takes
an optional linear warmup: for ``step < warmup_steps`` the rate rises linearly
from ``warmup_start`` to the schedule's starting value, and the schedule itself
then runs on ``step - warmup_steps`` (its lengths never include the warmup).

`make_schedule` builds one from epoch-based settings (what the train recipe's
``--lr_schedule``, ``--warmup_epochs``, ``--decay_epochs`` flags give). The
linear scaling rule for the global batch size is
`tfaccel.distribute.batching.scale_learning_rate`.

Example:

    from tfaccel.train import schedules
    from tfaccel.keras import keras

    lr = schedules.make_schedule("cosine", 1e-3, steps_per_epoch=20, epochs=30, warmup_epochs=2)
    optimizer = keras.optimizers.Adam(lr)
    float(lr(40))   # 0.001: end of warmup
"""

import math

import tensorflow as tf

from tfaccel.choices import SCHEDULES as SCHEDULES, check_schedule
from tfaccel.errors import ConfigError
from tfaccel.keras import keras, keras3


def _register(cls):
    """Registers `cls` for both formats: as 'tfaccel>Name' (.keras) and by its bare, unique
    class name, which is all the legacy .h5 loader looks up."""
    cls = keras.saving.register_keras_serializable(package="tfaccel")(cls)
    keras.saving.get_custom_objects()[cls.__name__] = cls
    return cls


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Base class: linear warmup, then `decay(step - warmup_steps)` of the subclass."""

    config_keys = ()
    """The subclass's own constructor arguments, kept as attributes of the same names."""

    def __init__(self, warmup_steps=0, warmup_start=0.0, name=None):
        super().__init__()
        if warmup_steps < 0:
            raise ConfigError(f"warmup_steps={warmup_steps} must be >= 0")
        self.warmup_steps = int(warmup_steps)
        self.warmup_start = float(warmup_start)
        self.name = name

    def decay(self, step):
        """The schedule after warmup at float32 `step` (0 = first step after warmup)."""
        raise NotImplementedError

    def __call__(self, step):
        with tf.name_scope(self.name or type(self).__name__):
            step = tf.cast(step, tf.float32)
            after = self.decay(tf.maximum(step - float(self.warmup_steps), 0.0))
            if self.warmup_steps == 0:
                return after
            peak = self.decay(tf.constant(0.0))
            warm = self.warmup_start + (peak - self.warmup_start) * step / float(self.warmup_steps)
            return tf.where(step < float(self.warmup_steps), warm, after)

    def get_config(self):
        return {"warmup_steps": self.warmup_steps, "warmup_start": self.warmup_start,
                "name": self.name, **{key: getattr(self, key) for key in self.config_keys}}


@_register
class ConstantSchedule(WarmupSchedule):
    """``learning_rate`` at every step (after the optional warmup)."""

    config_keys = ("learning_rate",)

    def __init__(self, learning_rate, **kwargs):
        super().__init__(**kwargs)
        self.learning_rate = float(learning_rate)

    def decay(self, step):
        return tf.fill(tf.shape(step), self.learning_rate)


@_register
class StepSchedule(WarmupSchedule):
    """``learning_rate * decay_rate ** floor(step / step_size)``."""

    config_keys = ("learning_rate", "step_size", "decay_rate")

    def __init__(self, learning_rate, step_size, decay_rate=0.1, **kwargs):
        super().__init__(**kwargs)
        if step_size <= 0:
            raise ConfigError(f"step decay step_size={step_size} must be > 0 steps")
        self.learning_rate, self.step_size, self.decay_rate = (
            float(learning_rate), int(step_size), float(decay_rate))

    def decay(self, step):
        return self.learning_rate * self.decay_rate ** tf.floor(step / self.step_size)


@_register
class PiecewiseSchedule(WarmupSchedule):
    """``values[i]`` for ``boundaries[i-1] <= step < boundaries[i]``
    (len(values) = len(boundaries) + 1)."""

    config_keys = ("boundaries", "values")

    def __init__(self, boundaries, values, **kwargs):
        super().__init__(**kwargs)
        boundaries, values = [int(b) for b in boundaries], [float(v) for v in values]
        if len(values) != len(boundaries) + 1:
            raise ConfigError(f"piecewise schedule has {len(boundaries)} boundaries and "
                              f"{len(values)} values: "
                              "it needs exactly one more value than boundaries")
        if any(b2 <= b1 for b1, b2 in zip(boundaries, boundaries[1:])) or any(
                b < 0 for b in boundaries):
            raise ConfigError(f"piecewise boundaries {boundaries} must be >= 0 and increasing")
        self.boundaries, self.values = boundaries, values

    def decay(self, step):
        index = tf.zeros_like(step, tf.int32)
        for boundary in self.boundaries:
            index += tf.cast(step >= float(boundary), tf.int32)
        return tf.gather(tf.constant(self.values, tf.float32), index)


@_register
class ExponentialSchedule(WarmupSchedule):
    """``learning_rate * decay_rate ** (step / decay_steps)`` (floored when ``staircase``)."""

    config_keys = ("learning_rate", "decay_steps", "decay_rate", "staircase")

    def __init__(self, learning_rate, decay_steps, decay_rate=0.1, staircase=False, **kwargs):
        super().__init__(**kwargs)
        if decay_steps <= 0:
            raise ConfigError(f"exponential decay_steps={decay_steps} must be > 0")
        self.learning_rate, self.decay_steps = float(learning_rate), int(decay_steps)
        self.decay_rate, self.staircase = float(decay_rate), bool(staircase)

    def decay(self, step):
        p = step / self.decay_steps
        return self.learning_rate * self.decay_rate ** (tf.floor(p) if self.staircase else p)


@_register
class PolynomialSchedule(WarmupSchedule):
    """``(lr - end) * (1 - min(step, decay_steps) / decay_steps) ** power + end``."""

    config_keys = ("learning_rate", "decay_steps", "end_learning_rate", "power")

    def __init__(self, learning_rate, decay_steps, end_learning_rate=0.0, power=1.0, **kwargs):
        super().__init__(**kwargs)
        if decay_steps <= 0:
            raise ConfigError(f"polynomial decay_steps={decay_steps} must be > 0")
        self.learning_rate, self.decay_steps = float(learning_rate), int(decay_steps)
        self.end_learning_rate, self.power = float(end_learning_rate), float(power)

    def decay(self, step):
        frac = 1.0 - tf.minimum(step, float(self.decay_steps)) / self.decay_steps
        return ((self.learning_rate - self.end_learning_rate) * frac ** self.power
                + self.end_learning_rate)


@_register
class CosineSchedule(WarmupSchedule):
    """``lr * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, decay_steps) / decay_steps)) + alpha)``.
    """

    config_keys = ("learning_rate", "decay_steps", "alpha")

    def __init__(self, learning_rate, decay_steps, alpha=0.0, **kwargs):
        super().__init__(**kwargs)
        if decay_steps <= 0:
            raise ConfigError(f"cosine decay_steps={decay_steps} must be > 0")
        self.learning_rate, self.decay_steps, self.alpha = (
            float(learning_rate), int(decay_steps), float(alpha))

    def decay(self, step):
        frac = tf.minimum(step, float(self.decay_steps)) / self.decay_steps
        cosine = 0.5 * (1.0 + tf.cos(math.pi * frac))
        return self.learning_rate * ((1.0 - self.alpha) * cosine + self.alpha)


@_register
class CosineRestartsSchedule(WarmupSchedule):
    """SGDR: cosine cycles, the i-th ``first_decay_steps * t_mul**i`` long and peaking at
    ``lr * m_mul**i``."""

    config_keys = ("learning_rate", "first_decay_steps", "t_mul", "m_mul", "alpha")

    def __init__(self, learning_rate, first_decay_steps, t_mul=2.0, m_mul=1.0, alpha=0.0, **kwargs):
        super().__init__(**kwargs)
        if first_decay_steps <= 0 or t_mul <= 0:
            raise ConfigError(f"cosine restarts first_decay_steps={first_decay_steps} and "
                              f"t_mul={t_mul} must be > 0")
        self.learning_rate, self.first_decay_steps = float(learning_rate), int(first_decay_steps)
        self.t_mul, self.m_mul, self.alpha = float(t_mul), float(m_mul), float(alpha)

    def decay(self, step):
        frac = step / self.first_decay_steps
        if self.t_mul == 1.0:
            cycle = tf.floor(frac)
            frac = frac - cycle
        else:
            cycle = tf.floor(tf.math.log(1.0 - frac * (1.0 - self.t_mul)) / math.log(self.t_mul))
            done = (1.0 - self.t_mul ** cycle) / (1.0 - self.t_mul)
            frac = (frac - done) / self.t_mul ** cycle
        cosine = 0.5 * self.m_mul ** cycle * (1.0 + tf.cos(math.pi * frac))
        return self.learning_rate * ((1.0 - self.alpha) * cosine + self.alpha)


@_register
class OneCycleSchedule(WarmupSchedule):
    """One-cycle: cosine from ``max_lr / div_factor`` up to ``max_lr`` over ``pct_start`` of
    ``total_steps``, then cosine down to ``max_lr / (div_factor * final_div_factor)``."""

    config_keys = (
        "max_learning_rate", "total_steps", "pct_start", "div_factor", "final_div_factor")

    def __init__(self, max_learning_rate, total_steps, pct_start=0.3, div_factor=25.0,
                 final_div_factor=1e4, **kwargs):
        super().__init__(**kwargs)
        if total_steps < 2 or not 0.0 < pct_start < 1.0:
            raise ConfigError(f"one-cycle total_steps={total_steps} must be >= 2 and "
                              f"pct_start={pct_start} strictly between 0 and 1")
        self.max_learning_rate, self.total_steps = float(max_learning_rate), int(total_steps)
        self.pct_start, self.div_factor = float(pct_start), float(div_factor)
        self.final_div_factor = float(final_div_factor)

    def decay(self, step):
        up = max(1.0, round(self.pct_start * self.total_steps))
        down = max(1.0, self.total_steps - up)
        start = self.max_learning_rate / self.div_factor
        end = start / self.final_div_factor

        def anneal(a, b, frac):
            return b + (a - b) * 0.5 * (1.0 + tf.cos(math.pi * tf.clip_by_value(frac, 0.0, 1.0)))

        return tf.where(step < up, anneal(start, self.max_learning_rate, step / up),
                        anneal(self.max_learning_rate, end, (step - up) / down))


@_register
class EpochExponentialSchedule(WarmupSchedule):
    """The classic Keras rule: keep ``learning_rate`` for ``hold_epochs`` epochs, then multiply
    by ``exp(-rate)`` each epoch: ``lr * exp(-rate * max(0, epoch - hold_epochs + 1))`` with
    ``epoch = floor(step / steps_per_epoch)``."""

    config_keys = ("learning_rate", "steps_per_epoch", "hold_epochs", "rate")

    def __init__(self, learning_rate, steps_per_epoch, hold_epochs=10, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        if steps_per_epoch <= 0 or hold_epochs < 0:
            raise ConfigError(f"epoch_exponential steps_per_epoch={steps_per_epoch} must be > 0 "
                              f"and hold_epochs={hold_epochs} >= 0")
        self.learning_rate, self.steps_per_epoch = float(learning_rate), int(steps_per_epoch)
        self.hold_epochs, self.rate = int(hold_epochs), float(rate)

    def decay(self, step):
        epoch = tf.floor(step / self.steps_per_epoch)
        return self.learning_rate * tf.exp(
            -self.rate * tf.maximum(0.0, epoch - self.hold_epochs + 1))


def make_schedule(name, learning_rate, *, steps_per_epoch, epochs, warmup_epochs=0.0,
                  decay_epochs=None, decay_rate=0.1, min_lr_ratio=0.0, boundaries=(),
                  multipliers=()):
    """A schedule by name, with lengths given in epochs (as the train recipe's flags are).

    Behaviour per name (``T = epochs - warmup_epochs``, the part after warmup; ``D`` =
    `decay_epochs`): ``constant``; ``step`` multiplies by `decay_rate` every D (default
    T/3) epochs; ``piecewise`` uses ``learning_rate * multipliers[i]`` between `boundaries`
    (epochs after warmup); ``exponential`` is ``lr * decay_rate ** (t / D)`` (D default T);
    ``polynomial`` is linear from lr to ``lr * min_lr_ratio`` over D (default T);
    ``cosine`` decays to ``lr * min_lr_ratio`` over D (default T); ``cosine_restarts``
    has a first cycle of D (default T/3) epochs, each next cycle twice as long;
    ``one_cycle`` rises for 30% of T then anneals; ``epoch_exponential`` keeps lr for
    D (default 10) epochs, then multiplies by ``exp(-decay_rate)`` each epoch.

    Args:
      name: one of `SCHEDULES`.
      learning_rate: peak learning rate.
      steps_per_epoch: optimizer steps per epoch (divide by gradient accumulation steps).
      epochs: training epochs.
      warmup_epochs: linear warmup from 0 (may be fractional).
      decay_epochs, decay_rate, min_lr_ratio, boundaries, multipliers: see above.

    Returns:
      A `WarmupSchedule`.

    Raises:
      ConfigError: unknown name, warmup as long as training or longer, bad lengths.
    """
    check_schedule(name, epochs, warmup_epochs, decay_epochs, boundaries, multipliers)
    if steps_per_epoch <= 0:
        raise ConfigError(f"steps_per_epoch={steps_per_epoch} must be > 0")

    def steps(e):
        return max(1, int(round(e * steps_per_epoch)))

    warm = {"warmup_steps": int(round(warmup_epochs * steps_per_epoch))}
    after = max(epochs - warmup_epochs, 1.0 / steps_per_epoch)
    lr = float(learning_rate)
    if name == "constant":
        return ConstantSchedule(lr, **warm)
    if name == "step":
        return StepSchedule(lr, steps(decay_epochs or after / 3), decay_rate, **warm)
    if name == "piecewise":
        return PiecewiseSchedule([steps(b) for b in boundaries], [lr * m for m in multipliers],
                                 **warm)
    if name == "exponential":
        return ExponentialSchedule(lr, steps(decay_epochs or after), decay_rate, **warm)
    if name == "polynomial":
        return PolynomialSchedule(lr, steps(decay_epochs or after), lr * min_lr_ratio, **warm)
    if name == "cosine":
        return CosineSchedule(lr, steps(decay_epochs or after), min_lr_ratio, **warm)
    if name == "cosine_restarts":
        return CosineRestartsSchedule(lr, steps(decay_epochs or after / 3), alpha=min_lr_ratio,
                                      **warm)
    if name == "one_cycle":
        return OneCycleSchedule(lr, max(2, steps(after)), **warm)
    return EpochExponentialSchedule(lr, steps_per_epoch,
                                    10 if decay_epochs is None else int(decay_epochs),
                                    decay_rate, **warm)


# Keras 3: the same schedules on Keras 3 optimizers.

_CLASS = []


def keras3_schedule_class():
    """The Keras 3 `LearningRateSchedule` that runs a tf_keras one (made, and registered with
    Keras 3's serialization, on first call: importing this module imports no Keras 3)."""
    if _CLASS:
        return _CLASS[0]
    keras_3 = keras3()

    @keras_3.saving.register_keras_serializable(package="tfaccel")
    class Keras3Schedule(keras_3.optimizers.schedules.LearningRateSchedule):
        """A tf_keras `LearningRateSchedule` (`schedule`) as a Keras 3 one: same rate, same step."""

        def __init__(self, schedule, steps_per_update=1):
            super().__init__()
            if isinstance(schedule, dict):  # from_config: the tf_keras schedule's serialization
                schedule = keras.optimizers.schedules.deserialize(schedule)
            self.schedule = schedule
            self.steps_per_update = int(steps_per_update)

        def __call__(self, step):
            if self.steps_per_update > 1:  # Keras 3 gives the step counting accumulated batches
                step = step // self.steps_per_update
            return self.schedule(step)

        def get_config(self):
            return {"schedule": keras.optimizers.schedules.serialize(self.schedule),
                    "steps_per_update": self.steps_per_update}

    _CLASS.append(Keras3Schedule)
    return Keras3Schedule


def for_keras(learning_rate, flavour, steps_per_update=1):
    """`learning_rate` (a float or a tf_keras schedule) as an optimizer of `flavour` takes it.

    A float, and anything already of that Keras, is returned unchanged; a tf_keras
    `LearningRateSchedule` given for 'keras3' comes back wrapped in `Keras3Schedule`.
    `steps_per_update` is the optimizer's `gradient_accumulation_steps`: Keras 3 then
    calls a schedule with the batches seen, and the wrapper gives it the updates made,
    which is what tfaccel's schedules count (as with tfaccel's own accumulation).
    """
    if flavour == "keras3" and isinstance(learning_rate,
                                          keras.optimizers.schedules.LearningRateSchedule):
        return keras3_schedule_class()(learning_rate, steps_per_update)
    return learning_rate
