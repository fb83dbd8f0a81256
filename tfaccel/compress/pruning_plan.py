"""Which layers to prune and on what schedule, decided and checked before anything is built.

`plan_pruning` chooses the layers `prune_to_sparsity` wraps and says why it
leaves the others dense: the first layer when it is a convolution (few
weights, large accuracy cost), layers with fewer than `min_weights` prunable
weights (e.g. a small classifier head), layers TF-MOT cannot prune, and layers
that cannot take the requested 2:4 (`m_by_n`) pattern. A layer named in
`include` that cannot be pruned as asked is an error instead of a silent skip
(TF-MOT's 2:4 leaves a kernel whose pruned axis is too small dense without a
word). `make_pruning_schedule` turns epochs and steps per epoch into TF-MOT's
begin/end steps. Both raise one clear line before any model is cloned, so a
recipe can call them to check its flags.

Example:

    from tfaccel.compress import pruning_plan

    config = pruning_plan.PruneConfig(block_size=(1, 4))
    plan = pruning_plan.plan_pruning(model, config)
    plan.pruned, plan.skipped        # ('conv_1', 'dense'), {'conv_0': 'first convolution ...'}
    pruning_plan.make_pruning_schedule(0.8, epochs=10, steps_per_epoch=20, config=config)
"""

import dataclasses

import numpy as np

from tfaccel import _compat
from tfaccel.choices import (
    PRUNING_SCHEDULES,
    check_prune_pattern,
    check_pruning_epochs,
    check_sparsity,
)
from tfaccel.compress.prunable import ways_out
from tfaccel.errors import ConfigError, ModelError, UnsupportedLayerError, first_line
from tfaccel.keras import (
    ensure_tf_keras,
    keras,
    tfmot as tfmot,  # TF-MOT, its TF_USE_LEGACY_KERAS side effect undone
)
from tfaccel.keras.bridge import as_tf_keras


def walk_layers(model):
    """Yields the layers of `model`, descending into nested models (which are not yielded)."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from walk_layers(layer)
        else:
            yield layer


def is_pruning_wrapper(layer):
    """True for a layer wrapped by TF-MOT's `prune_low_magnitude`."""
    return isinstance(layer, _compat.pruning_wrapper_class())


def pruning_wrappers(model):
    """The pruning wrappers of `model`, nested models included, in layer order."""
    return [layer for layer in walk_layers(model) if is_pruning_wrapper(layer)]


def registry_supports(layer):
    """True when TF-MOT knows the layer type (it may prune nothing in it, e.g. BatchNorm)."""
    return _compat.prune_registry_supports(layer)


def prunable_weights(layer):
    """The weights TF-MOT would prune in `layer` (kernels), or [] if it cannot prune it."""
    if hasattr(layer, "get_prunable_weights"):
        return list(layer.get_prunable_weights())
    if not registry_supports(layer):
        return []
    names = _compat.prune_registry_weight_names(layer)
    return [getattr(layer, n) for n in names if getattr(layer, n, None) is not None]


def pruning_step(model):
    """The pruning step the wrappers of `model` are at (-1 before training starts)."""
    steps = [int(layer.pruning_step.numpy()) for layer in pruning_wrappers(model)]
    if not steps:
        raise ModelError(f"model {model.name!r} has no pruning wrappers")
    return max(steps)


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


# ---------------------------------------------------------------- schedule


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
    kind, args = pruning_schedule_args(target_sparsity, epochs, steps_per_epoch, config)
    return getattr(tfmot().sparsity.keras, kind)(**args)


def pruning_schedule_args(target_sparsity, epochs, steps_per_epoch, config=PruneConfig()):
    """('PolynomialDecay' or 'ConstantSparsity', its arguments): `make_pruning_schedule`'s
    schedule, for TF-MOT's classes or `tfaccel.compress.magnitude`'s (same arguments)."""
    target = check_sparsity(target_sparsity)
    initial = check_sparsity(config.initial_sparsity, "initial_sparsity")
    if config.schedule not in PRUNING_SCHEDULES:
        raise ConfigError(f"schedule={config.schedule!r}: use one of "
                          f"{', '.join(PRUNING_SCHEDULES)}")
    if int(epochs) < 1 or int(steps_per_epoch) < 1:
        raise ConfigError(f"epochs={epochs} and steps_per_epoch={steps_per_epoch} must be >= 1: "
                          "pruning needs fine-tuning steps")
    total = int(epochs) * int(steps_per_epoch)
    begin_epoch, end_epoch = check_pruning_epochs(epochs, config.begin_epoch, config.end_epoch,
                                                  config.frequency)
    begin = round(begin_epoch * steps_per_epoch)
    end = min(round(end_epoch * steps_per_epoch), total - 1)
    frequency = int(config.frequency or max(1, (end - begin) // 20))
    if config.schedule == "constant":
        return "ConstantSparsity", {"target_sparsity": target, "begin_step": begin,
                                    "end_step": -1, "frequency": frequency}
    if initial > target:
        raise ConfigError(f"initial_sparsity={initial:g} is above the target {target:g}: "
                          "a ramp goes up to the target")
    updates = (end - begin) // frequency
    if updates < 1:
        raise ConfigError(f"the ramp from step {begin} to {end} is shorter than frequency="
                          f"{frequency}: widen begin_epoch..end_epoch, lower the frequency, "
                          "or use schedule='constant'")
    return "PolynomialDecay", {"initial_sparsity": initial, "final_sparsity": target,
                               "begin_step": begin, "end_step": begin + updates * frequency,
                               "power": config.power, "frequency": frequency}


# ---------------------------------------------------------------- which layers


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


def check_prunable_model(model):
    """Raises when TF-MOT cannot prune `model` (Keras 3, subclassed, already pruned)."""
    ensure_tf_keras(model)
    if not isinstance(model, keras.Model):
        raise ModelError(f"expected a tf_keras Model, got {type(model).__name__}")
    if not _compat.is_graph_network(model):
        raise UnsupportedLayerError(
            f"model {model.name!r} is a subclassed keras.Model ({type(model).__name__}), which "
            "TF-MOT cannot prune: rebuild it with the functional API or Sequential, or wrap "
            "its layers with prune_low_magnitude inside your class")
    wrapped = [layer.name for layer in pruning_wrappers(model)]
    if wrapped:
        raise ModelError(f"model {model.name!r} is already pruned (layers {', '.join(wrapped)}): "
                         "keep training it with its callbacks, or strip_pruning() it first")
    return model


def plan_pruning(model, config=PruneConfig()):
    """Decides which layers `prune_to_sparsity` prunes and why it leaves the others dense.

    Args:
      model: a Sequential or functional tf_keras model (or a Keras 3 one: its
        tf_keras translation is planned, with the same layer names).
      config: a `PruneConfig` (include/exclude, min_weights, patterns, policy).

    Returns:
      A `PruningPlan`.

    Raises:
      ConfigError: unknown names in include/exclude, or nothing left to prune.
      UnsupportedLayerError: a subclassed model, or an included layer that
        cannot be pruned as asked (e.g. 2:4 on a 1-channel convolution).
    """
    model = as_tf_keras(model)
    check_prunable_model(model)
    check_prune_pattern(config.m_by_n, config.block_size, config.block_pooling,
                        config.policy)
    layers = list(walk_layers(model))
    known = {layer.name for layer in layers} | {type(layer).__name__ for layer in layers}
    for field in ("include", "exclude"):
        unknown = [n for n in getattr(config, field) if n not in known]
        if unknown:
            raise ConfigError(f"{field}={','.join(unknown)}: no such layer name or class in "
                              f"{model.name!r}; "
                              f"layers: {', '.join(layer.name for layer in layers)}")
    policy = tfmot().sparsity.keras.PruneForLatencyOnXNNPack() if config.policy else None
    if policy is not None:
        try:
            policy.ensure_model_supports_pruning(model)
        except ValueError as e:
            raise UnsupportedLayerError(f"policy='xnnpack' does not fit model {model.name!r}: "
                                        f"{first_line(e)}; drop the policy for this model"
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
        if not weights and not explicit and registry_supports(layer):
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
    return ways_out(reasons, fixes, "give a model with Conv/Dense kernels to prune")
