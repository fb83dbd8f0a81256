"""Magnitude pruning with TF-MOT in one call, with sane defaults and the known traps fixed.

`prune_to_sparsity` wraps the layers worth pruning in TF-MOT's
`PruneLowMagnitude` and returns the pruned copy with the callbacks `fit` needs
(TF-MOT's mandatory `UpdatePruningStep`, per-layer sparsity in TensorBoard,
and optionally a backup so that a killed run resumes with its pruning step).
The schedule's begin and end steps come from epochs and steps per epoch; by
default sparsity ramps up (polynomial decay) over the first two thirds of the
fine-tuning and holds for the last third, so accuracy recovers at the target.
`strip_pruning` removes the wrappers (weights stay sparse) for export;
`tfaccel.compress.sparsity` measures what you got.

Layers left dense by default (and said so, see `plan_pruning`): the first
layer when it is a convolution (few weights, large accuracy cost), layers with
fewer than `min_weights` prunable weights (e.g. a small classifier head),
layers TF-MOT cannot prune, and layers that cannot take the requested 2:4
(`m_by_n`) pattern. A layer named in `include` that cannot be pruned as asked
is an error instead of a silent skip (TF-MOT's 2:4 leaves a kernel whose
pruned axis is too small dense without a word). A `block_size` applies where
TF-MOT can use it (2-D kernels: Dense); convolutions are pruned element-wise
at the same sparsity (`PruningPlan.element_wise` names them).

Works under `mixed_float16`/`mixed_bfloat16` (TF-MOT issue #409: masking
fails under MirroredStrategy and, without one, rounds the float32 master
weights to half precision at every step; here masks are computed and applied
in the variables' own float32) and inside a `tf.distribute` scope (the copy is
built in the scope that is active when you call it).

Example:

    from tfaccel.compress import prune
    from tfaccel.train import training

    pruned, callbacks = prune.prune_to_sparsity(model, 0.8, epochs=20, steps_per_epoch=20,
                                                log_dir="runs/p/logs/pruning")
    training.compile_classifier(pruned, training.make_optimizer("adam", 1e-3))
    pruned.fit(train_ds, epochs=20, callbacks=callbacks)
    small = prune.strip_pruning(pruned)              # plain layers, sparse weights
"""

import dataclasses
import numbers

import numpy as np
import tensorflow as tf
from absl import logging

from tfaccel.choices import BLOCK_POOLINGS, PRUNING_POLICIES, PRUNING_SCHEDULES
from tfaccel.errors import ConfigError, ModelError, UnsupportedLayerError, first_line
from tfaccel.keras import ensure_tf_keras, keras


@dataclasses.dataclass(frozen=True)
class PruneConfig:
    """How to prune, apart from the target sparsity and the length of the run.

    Attributes:
      schedule: 'polynomial' (ramp from `initial_sparsity` to the target between
        `begin_epoch` and `end_epoch`) or 'constant' (the target from `begin_epoch`).
      initial_sparsity: sparsity at the start of a polynomial ramp.
      begin_epoch: epoch (may be fractional) of fine-tuning where pruning starts.
      end_epoch: epoch where the ramp reaches the target; default two thirds of
        the epochs, leaving the rest to recover accuracy at the final sparsity.
      frequency: steps between mask updates; default about 20 updates per ramp.
      power: exponent of the polynomial ramp.
      m_by_n: e.g. (2, 4): at least 2 zeros in every 4 consecutive weights along
        the input-channel axis (sparsity m/n; TF-MOT sets this mask once, at step 1).
      block_size: (rows, cols) blocks pruned together in 2-D kernels; layers
        with other kernels (convolutions) are pruned element-wise.
      block_pooling: 'AVG' or 'MAX', how a block's magnitude is pooled.
      policy: None or 'xnnpack' (TF-MOT's PruneForLatencyOnXNNPack: 1x1
        convolutions of a model XNNPACK's sparse inference can run).
      include: layer names or class names to prune; empty means choose automatically.
      exclude: layer names or class names never to prune.
      keep_first_conv: leave the first layer dense when it is a convolution.
      min_weights: leave layers with fewer prunable weights dense.
    """

    schedule: str = "polynomial"
    initial_sparsity: float = 0.0
    begin_epoch: float = 0.0
    end_epoch: float | None = None
    frequency: int | None = None
    power: int = 3
    m_by_n: tuple | None = None
    block_size: tuple = (1, 1)
    block_pooling: str = "AVG"
    policy: str | None = None
    include: tuple = ()
    exclude: tuple = ()
    keep_first_conv: bool = True
    min_weights: int = 2048


@dataclasses.dataclass(frozen=True)
class PruningPlan:
    """Which layers get pruned, and why the others stay dense ({name: reason}).

    `element_wise` names the pruned layers that a `block_size` does not fit
    (TF-MOT prunes blocks of 2-D kernels only, e.g. Dense): they are pruned
    element-wise instead, at the same sparsity.
    """

    pruned: tuple
    skipped: dict
    element_wise: tuple = ()


def _tfmot():
    import tensorflow_model_optimization as tfmot

    return tfmot


def _wrapper_class():
    from tensorflow_model_optimization.python.core.sparsity.keras import pruning_wrapper

    return pruning_wrapper.PruneLowMagnitude


# ---------------------------------------------------------------- schedule


def check_sparsity(value, name="target_sparsity"):
    """Returns `value` as a float if it is in [0, 1), else raises ConfigError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ConfigError(f"{name}={value!r} must be in [0, 1), e.g. 0.8 for 80% zeros")
    return float(value)


def make_pruning_schedule(target_sparsity, epochs, steps_per_epoch, config=PruneConfig()):
    """A TF-MOT pruning schedule whose steps come from epochs and steps per epoch.

    The ramp's end is moved onto a mask-update step (so the target is really
    applied) and at most to the last training step.

    Example:

        schedule = make_pruning_schedule(0.8, epochs=10, steps_per_epoch=20)
        schedule.begin_step, schedule.end_step, schedule.frequency   # 0, 132, 6

    Args:
      target_sparsity: final share of zeros, in [0, 1).
      epochs: epochs of pruning fine-tuning.
      steps_per_epoch: optimizer steps per epoch.
      config: a `PruneConfig` (schedule kind, begin/end epochs, frequency).

    Returns:
      A `PolynomialDecay` or `ConstantSparsity`.

    Raises:
      ConfigError: sparsity outside [0, 1), end before begin, or epochs/steps < 1.
    """
    target = check_sparsity(target_sparsity)
    initial = check_sparsity(config.initial_sparsity, "initial_sparsity")
    if config.schedule not in PRUNING_SCHEDULES:
        raise ConfigError(f"schedule={config.schedule!r}: use one of "
                          f"{', '.join(PRUNING_SCHEDULES)}")
    if int(epochs) < 1 or int(steps_per_epoch) < 1:
        raise ConfigError(f"epochs={epochs} and steps_per_epoch={steps_per_epoch} must be >= 1: "
                          "pruning needs fine-tuning steps")
    total = int(epochs) * int(steps_per_epoch)
    begin_epoch = float(config.begin_epoch)
    end_epoch = float(config.end_epoch) if config.end_epoch is not None else max(
        begin_epoch, 2.0 * epochs / 3.0)
    if not 0 <= begin_epoch < epochs:
        raise ConfigError(f"begin_epoch={begin_epoch:g} must be in [0, epochs={epochs}): "
                          "pruning must start during the fine-tuning")
    if end_epoch < begin_epoch:
        raise ConfigError(f"end_epoch={end_epoch:g} is before begin_epoch={begin_epoch:g}: "
                          "pruning must end after it begins")
    if end_epoch > epochs:
        raise ConfigError(f"end_epoch={end_epoch:g} is after the last epoch ({epochs}): "
                          "the target would never be reached; lower it or add epochs")
    begin = round(begin_epoch * steps_per_epoch)
    end = min(round(end_epoch * steps_per_epoch), total - 1)
    if config.frequency is not None and int(config.frequency) < 1:
        raise ConfigError(f"frequency={config.frequency} must be a positive number of steps")
    frequency = int(config.frequency or max(1, (end - begin) // 20))
    if config.schedule == "constant":
        return _tfmot().sparsity.keras.ConstantSparsity(target, begin, -1, frequency)
    if initial > target:
        raise ConfigError(f"initial_sparsity={initial:g} is above the target {target:g}: "
                          "a ramp goes up to the target")
    updates = (end - begin) // frequency
    if updates < 1:
        raise ConfigError(f"the ramp from step {begin} to {end} is shorter than frequency="
                          f"{frequency}: widen begin_epoch..end_epoch, lower the frequency, "
                          "or use schedule='constant'")
    return _tfmot().sparsity.keras.PolynomialDecay(
        initial, target, begin, begin + updates * frequency, power=config.power,
        frequency=frequency)


# ---------------------------------------------------------------- which layers


def _walk(model):
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _walk(layer)
        else:
            yield layer


def prunable_weights(layer):
    """The weights TF-MOT would prune in `layer` (kernels), or [] if it cannot prune it."""
    if hasattr(layer, "get_prunable_weights"):
        return list(layer.get_prunable_weights())
    registry = _registry()
    if not registry.supports(layer):
        return []
    names = registry._weight_names(layer)  # TF-MOT's own table of kernels
    return [getattr(layer, n) for n in names if getattr(layer, n, None) is not None]


def _registry():
    from tensorflow_model_optimization.python.core.sparsity.keras import prune_registry

    return prune_registry.PruneRegistry


def pruned_axis_size(kernel_shape):
    """Length of the axis 2:4 groups run along: input channels (TF-MOT uses TFLite's layout)."""
    return int(kernel_shape[-2]) if len(kernel_shape) in (2, 4) else None


def _pattern_problem(weights, config):
    """Why `weights` cannot take the config's m_by_n or block pattern, or None."""
    for w in weights:
        shape = tuple(w.shape)
        if config.m_by_n:
            n = config.m_by_n[1]
            axis = pruned_axis_size(shape)
            if axis is None:
                return f"{config.m_by_n[0]}:{n} sparsity needs a 2-D or 4-D kernel, not {shape}"
            if axis % n:
                return (f"{config.m_by_n[0]}:{n} sparsity needs input channels divisible by {n}, "
                        f"kernel {shape} has {axis}")
    return None


def _takes_blocks(weights, config):
    """True when `config.block_size` applies to these kernels (TF-MOT blocks only 2-D ones)."""
    return tuple(config.block_size) != (1, 1) and all(len(w.shape) == 2 for w in weights)


def _matches(layer, names):
    return layer.name in names or type(layer).__name__ in names


def _check_config(config):
    if config.m_by_n is not None:
        m_by_n = tuple(config.m_by_n)
        if len(m_by_n) != 2 or not all(isinstance(v, int) for v in m_by_n) or \
                not 0 < m_by_n[0] < m_by_n[1]:
            raise ConfigError(f"m_by_n={config.m_by_n!r} must be two integers 0 < m < n, "
                              "e.g. (2, 4)")
        if tuple(config.block_size) != (1, 1):
            raise ConfigError("m_by_n and block_size cannot be combined: pick one pattern")
    if len(tuple(config.block_size)) != 2 or min(config.block_size) < 1:
        raise ConfigError(f"block_size={config.block_size!r} must be two positive integers")
    if config.block_pooling not in BLOCK_POOLINGS:
        raise ConfigError(f"block_pooling={config.block_pooling!r}: use 'AVG' or 'MAX'")
    if config.policy not in (None, *PRUNING_POLICIES):
        raise ConfigError(f"policy={config.policy!r}: use None or one of "
                          f"{', '.join(PRUNING_POLICIES)}")


def check_prunable_model(model):
    """Raises when TF-MOT cannot prune `model` (Keras 3, subclassed, already pruned)."""
    ensure_tf_keras(model)
    if not isinstance(model, keras.Model):
        raise ModelError(f"expected a tf_keras Model, got {type(model).__name__}")
    if not (isinstance(model, keras.Sequential) or getattr(model, "_is_graph_network", False)):
        raise UnsupportedLayerError(
            f"model {model.name!r} is a subclassed keras.Model ({type(model).__name__}), which "
            "TF-MOT cannot prune: rebuild it with the functional API or Sequential, or wrap "
            "its layers with prune_low_magnitude inside your class")
    wrapped = [layer.name for layer in _walk(model) if isinstance(layer, _wrapper_class())]
    if wrapped:
        raise ModelError(f"model {model.name!r} is already pruned (layers {', '.join(wrapped)}): "
                         "keep training it with its callbacks, or strip_pruning() it first")
    return model


def plan_pruning(model, config=PruneConfig()):
    """Decides which layers `prune_to_sparsity` prunes and why it leaves the others dense.

    Args:
      model: a Sequential or functional tf_keras model.
      config: a `PruneConfig` (include/exclude, min_weights, patterns, policy).

    Returns:
      A `PruningPlan`.

    Raises:
      ConfigError: unknown names in include/exclude, or nothing left to prune.
      UnsupportedLayerError: a subclassed model, or an included layer that
        cannot be pruned as asked (e.g. 2:4 on a 1-channel convolution).
    """
    check_prunable_model(model)
    _check_config(config)
    layers = list(_walk(model))
    known = {layer.name for layer in layers} | {type(layer).__name__ for layer in layers}
    for field in ("include", "exclude"):
        unknown = [n for n in getattr(config, field) if n not in known]
        if unknown:
            raise ConfigError(f"{field}={','.join(unknown)}: no such layer name or class in "
                              f"{model.name!r}; "
                              f"layers: {', '.join(layer.name for layer in layers)}")
    policy = _tfmot().sparsity.keras.PruneForLatencyOnXNNPack() if config.policy else None
    if policy is not None:
        try:
            policy.ensure_model_supports_pruning(model)
        except ValueError as e:
            raise UnsupportedLayerError(f"policy='xnnpack' does not fit model {model.name!r}: "
                                        f"{str(e).strip()}; drop the policy for this model"
                                        ) from None
    pruned, skipped, element_wise = [], {}, []
    first_kernel_seen = False
    for layer in layers:
        weights = prunable_weights(layer)
        if not layer.weights:
            continue
        is_first = bool(weights) and not first_kernel_seen
        first_kernel_seen = first_kernel_seen or bool(weights)
        explicit = _matches(layer, config.include)
        if not weights and not explicit and _registry().supports(layer):
            continue  # TF-MOT prunes nothing in it by design (BatchNormalization, DepthwiseConv2D)
        if _matches(layer, config.exclude):
            skipped[layer.name] = "excluded"
            continue
        if config.include and not explicit:
            skipped[layer.name] = "not in include"
            continue
        reason = None
        if not weights:
            reason = (f"TF-MOT cannot prune a {type(layer).__name__} (not in its registry, no "
                      "get_prunable_weights method)")
        elif policy is not None and not policy.allow_pruning(layer):
            reason = "not a 1x1 convolution (xnnpack policy)"
        else:
            reason = _pattern_problem(weights, config)
        if reason and explicit:
            raise UnsupportedLayerError(f"layer {layer.name!r} cannot be pruned as asked: "
                                        f"{reason}; "
                                        "remove it from include")
        size = sum(int(np.prod(w.shape)) for w in weights)
        if not reason and not explicit:
            if config.keep_first_conv and is_first and len(weights[0].shape) >= 3:
                reason = "first convolution (kept dense: pruning it costs the most accuracy)"
            elif size < config.min_weights:
                reason = f"only {size} weights (< min_weights={config.min_weights})"
        if reason:
            skipped[layer.name] = reason
        else:
            pruned.append(layer.name)
            if tuple(config.block_size) != (1, 1) and not _takes_blocks(weights, config):
                element_wise.append(layer.name)
    if not pruned:
        reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items()) or \
            "no layer has a kernel TF-MOT can prune"
        raise ConfigError(f"nothing to prune in {model.name!r}: {reasons}: "
                          f"{_nothing_to_prune_fix(skipped.values(), config)}")
    return PruningPlan(tuple(pruned), skipped, tuple(element_wise))


def _nothing_to_prune_fix(reasons, config):
    """The ways out that match why each layer stayed dense (the PruneConfig fields to change)."""
    fixes = {"excluded": "remove layers from exclude",
             "not in include": "name more layers in include",
             "first convolution": "set keep_first_conv=False",
             "< min_weights": f"lower min_weights (now {config.min_weights})",
             "xnnpack policy": "drop policy='xnnpack'",
             "sparsity needs": "drop m_by_n or pick one whose n divides the input channels"}
    found = [fix for key, fix in fixes.items() if any(key in r for r in reasons)]
    return ", or ".join(found) if found else "give a model with Conv/Dense kernels to prune"


# ---------------------------------------------------------------- pruning


def _float32_pruning_class():
    from tensorflow_model_optimization.python.core.sparsity.keras import pruning_impl

    autocast = keras.src.mixed_precision.autocast_variable

    class Float32Pruning(pruning_impl.Pruning):
        """TF-MOT's pruning ops with mixed precision variables read in float32.

        Inside a layer's call, AutoCastVariables read as float16/bfloat16, so
        TF-MOT masks half-precision copies and assigns them back to the float32
        variables: a dtype error under MirroredStrategy (TF-MOT issue #409) and
        master weights rounded to half precision at every step without one.
        """

        def weight_mask_op(self):
            with autocast.enable_auto_cast_variables(None):
                return super().weight_mask_op()

        def conditional_mask_update(self):
            with autocast.enable_auto_cast_variables(None):
                return super().conditional_mask_update()

    return Float32Pruning


def _use_float32_pruning(model):
    """Swaps each wrapper's pruning object for `Float32Pruning` (before the first trace)."""
    cls = _float32_pruning_class()
    for layer in _walk(model):
        if isinstance(layer, _wrapper_class()) and layer.pruning_obj is not None \
                and not isinstance(layer.pruning_obj, cls):
            old = layer.pruning_obj
            layer.pruning_obj = cls(
                training_step_fn=old._step_fn, pruning_vars=old._pruning_vars,
                pruning_schedule=old._pruning_schedule, block_size=old._block_size,
                block_pooling_type=old._block_pooling_type,
                sparsity_m_by_n=old._sparsity_m_by_n)
    return model


def _rebuild(model, names, wrap):
    """A copy of `model` built in the current scope, layers in `names` wrapped, same weights."""
    pairs = []

    def clone_layer(layer):
        if isinstance(layer, keras.Model):
            return keras.models.clone_model(layer, clone_function=clone_layer)
        new = type(layer).from_config(layer.get_config())
        pairs.append((layer, new))
        return wrap(new) if layer.name in names else new

    clone = keras.models.clone_model(model, clone_function=clone_layer)
    for old, new in pairs:
        if old.weights:
            new.set_weights(old.get_weights())
    return clone


def prune_to_sparsity(model, target_sparsity, epochs, steps_per_epoch, config=PruneConfig(), *,
                      log_dir=None, backup_dir=None, backup_freq="epoch",
                      delete_backup_after_fit=True):
    """Prepares `model` for pruning to `target_sparsity` over `epochs` of fine-tuning.

    Returns a pruned copy (not compiled: compile it in the same strategy scope)
    and the callbacks to pass to `fit`. The layers pruned and those left dense
    are logged (see `plan_pruning`). Call it inside `strategy.scope()` to train
    distributed, after `set_precision` to train in mixed precision.

    Example:

        with strategy.scope():
            pruned, callbacks = prune_to_sparsity(model, 0.8, 20, steps_per_epoch=20)
            training.compile_classifier(pruned, training.make_optimizer("adam", 1e-3))
        pruned.fit(train_ds, epochs=20, callbacks=callbacks)

    Args:
      model: a trained Sequential or functional tf_keras model (e.g. loaded
        from a .keras file or SavedModel).
      target_sparsity: share of zeros to reach in each pruned layer, in [0, 1)
        (with `config.m_by_n` the pattern decides: m/n).
      epochs: epochs you will fit for.
      steps_per_epoch: optimizer steps per epoch.
      config: a `PruneConfig`.
      log_dir: if given, per-layer sparsity goes to TensorBoard there each epoch.
      backup_dir: if given, the run is backed up there (`tfaccel.train.resume`) and
        a rerun after a kill resumes with its pruning step, masks and optimizer.
      backup_freq: 'epoch' or a number of steps between backups.
      delete_backup_after_fit: delete the backup when `fit` returns. Pass False
        when results are written after `fit`, and call `resume.remove_backup`
        after the last one, so that a kill in between does not lose the pruning.

    Returns:
      (pruned_model, callbacks).

    Raises:
      ConfigError: bad sparsity, schedule or layer names.
      UnsupportedLayerError: subclassed model, or an included layer that
        cannot take the requested pattern.
    """
    plan = plan_pruning(model, config)
    schedule = make_pruning_schedule(target_sparsity, epochs, steps_per_epoch, config)
    params = {"pruning_schedule": schedule, "block_pooling_type": config.block_pooling,
              "sparsity_m_by_n": tuple(config.m_by_n) if config.m_by_n else None}

    def wrap(layer):
        block = (1, 1) if layer.name in plan.element_wise else tuple(config.block_size)
        return _wrapper_class()(layer, block_size=block, **params)

    try:
        pruned = _rebuild(model, set(plan.pruned), wrap)
    except ValueError as e:
        raise ModelError(f"TF-MOT cannot prune {model.name!r}: {first_line(e)}") from None
    _use_float32_pruning(pruned)
    target = config.m_by_n[0] / config.m_by_n[1] if config.m_by_n else target_sparsity
    logging.info("pruning %s to %.0f%%: %s; left dense: %s", model.name, 100 * target,
                 ", ".join(plan.pruned),
                 "; ".join(f"{k} ({v})" for k, v in plan.skipped.items()) or "none")
    if plan.element_wise:
        logging.info("blocks of %s fit only 2-D kernels: %s pruned element-wise",
                     "x".join(map(str, config.block_size)), ", ".join(plan.element_wise))
    callbacks = []
    if backup_dir:
        from tfaccel.train import resume

        callbacks += resume.backup_callbacks(backup_dir, backup_freq, epochs,
                                             delete_after_fit=delete_backup_after_fit)
    # Without UpdatePruningStep the wrappers fail at the first step and never update masks.
    callbacks.append(_tfmot().sparsity.keras.UpdatePruningStep())
    if log_dir:
        from tfaccel.compress.sparsity import SparsityLogger

        callbacks.append(SparsityLogger(log_dir))
    return pruned, callbacks


def pruning_step(model):
    """The pruning step the wrappers of `model` are at (-1 before training starts)."""
    steps = [int(layer.pruning_step.numpy()) for layer in _walk(model)
             if isinstance(layer, _wrapper_class())]
    if not steps:
        raise ModelError(f"model {model.name!r} has no pruning wrappers")
    return max(steps)


def apply_masks(model):
    """Multiplies every pruned weight by its mask now (TF-MOT only does it per step and epoch)."""
    for layer in _walk(model):
        if isinstance(layer, _wrapper_class()):
            for weight, mask, _ in layer.pruning_vars:
                weight.assign(tf.cast(weight.read_value() * tf.cast(mask.read_value(),
                                                                     weight.dtype), weight.dtype))
    return model


def strip_pruning(model, float32=False):
    """`model` without pruning wrappers: the same layers as before pruning, weights sparse.

    Args:
      model: a model from `prune_to_sparsity` (after `fit`).
      float32: also rebuild a mixed precision model in float32 (for export).

    Returns:
      A new, uncompiled model.
    """
    ensure_tf_keras(model)
    apply_masks(model)
    stripped = _tfmot().sparsity.keras.strip_pruning(model)
    if float32:
        from tfaccel.performance.precision import apply_precision

        stripped = apply_precision(stripped, "float32")
    return stripped


def load_pruned_model(path):
    """Loads a model saved with its pruning wrappers (e.g. a mid-run .keras file).

    TF-MOT does not save `m_by_n` in the wrapper's config: keep pruning a 2:4
    model from a backup (`backup_dir`) instead of from such a file.
    """
    with _tfmot().sparsity.keras.prune_scope():
        from tfaccel.train.models import load_model_file

        model = load_model_file(path)
    return _use_float32_pruning(model)
