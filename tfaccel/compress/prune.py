"""Magnitude pruning with TF-MOT in one call, with sane defaults and the known traps fixed.

`prune_to_sparsity` wraps the layers `plan_pruning` chose
(`tfaccel.compress.pruning_plan`) in TF-MOT's `PruneLowMagnitude` and returns
the pruned copy with the callbacks `fit` needs (TF-MOT's mandatory
`UpdatePruningStep`, per-layer sparsity in TensorBoard, and optionally a
backup so that a killed run resumes with its pruning step). The schedule's
begin and end steps come from epochs and steps per epoch; by default sparsity
ramps up (polynomial decay) over the first two thirds of the fine-tuning and
holds for the last third, so accuracy recovers at the target.
`strip_pruning` removes the wrappers (weights stay sparse) for export;
`tfaccel.compress.sparsity` measures what you got.

A Keras 3 model (TF-MOT has no Keras 3 support) is pruned through its
tf_keras translation (`tfaccel.keras.bridge`, checked to give the same
outputs): the pruned model you fine-tune is tf_keras, and `strip_pruning`
translates the result back, so a Keras 3 model comes out as a Keras 3 model
with the sparse weights (the crossing checked again). A `block_size` applies
where TF-MOT can use it (2-D kernels: Dense); convolutions are pruned
element-wise at the same sparsity (`PruningPlan.element_wise` names them).

A model TF-MOT cannot take (a Keras 3 model with layers the bridge cannot
translate: custom layers, KerasHub models, raw ops; a subclassed model) is
pruned without TF-MOT instead (`method="auto"`, the default): by
`tfaccel.compress.magnitude`, on the model itself, with the same schedule
and the same layer choices; `method="tfmot"` or `"native"` forces one.

Works under `mixed_float16`/`mixed_bfloat16` (TF-MOT issue #409: masking
fails under MirroredStrategy and, without one, rounds the float32 master
weights to half precision at every step; here masks are computed and applied
in the variables' own float32) and inside a `tf.distribute` scope (the copy is
built in the scope that is active when you call it).

Example:

    from tfaccel.compress import prune
    from tfaccel.train import training

    pruned, callbacks = prune.prune_to_sparsity(model, 0.8, epochs=20, steps_per_epoch=20,
                                                logdir="runs/p/logs/pruning")
    training.compile_classifier(pruned, training.make_optimizer("adam", 1e-3))
    pruned.fit(train_ds, epochs=20, callbacks=callbacks)
    small = prune.strip_pruning(pruned)              # plain layers, sparse weights

A Keras 3 model, the same way (`model3` a Keras 3 Sequential or functional model):

    pruned, callbacks = prune.prune_to_sparsity(model3, 0.8, epochs=4, steps_per_epoch=20)
    training.compile_classifier(pruned, training.make_optimizer("adam", 1e-3))   # tf_keras
    pruned.fit(train_ds, epochs=4, callbacks=callbacks)
    small3 = prune.strip_pruning(pruned)             # a Keras 3 model, sparse weights
"""

import weakref

import tensorflow as tf
from absl import logging

from tfaccel import _compat
from tfaccel.choices import PRUNING_METHODS
from tfaccel.compress import magnitude, prunable
from tfaccel.compress.pruning_plan import (  # also this module's names, as before the split
    PruneConfig,
    PruningPlan as PruningPlan,
    make_pruning_schedule,
    plan_pruning,
    pruning_schedule_args,
    pruning_wrappers,
    tfmot,
)
from tfaccel.compress.sparsity import SparsityLogger
from tfaccel.errors import ConfigError, ModelError, UnsupportedLayerError, first_line
from tfaccel.keras import (
    check_flavour,
    clone_with_weights,
    ensure_tf_keras,
    flavour_of,
    is_keras3_object,
    keras,
)
from tfaccel.keras.bridge import as_tf_keras, to_flavour, untranslatable_layers
from tfaccel.train import resume
from tfaccel.train.models import load_model_file
from tfaccel.train.precision import apply_precision

# The Keras of the model each pruned model was made from: `strip_pruning` returns it in that Keras.
_MADE_FROM = weakref.WeakKeyDictionary()


def _mask_in_float32(model):
    """Makes every wrapper of `model` mask in float32 (before the first trace; see `_compat`)."""
    for wrapper in pruning_wrappers(model):
        _compat.mask_in_float32(wrapper)
    return model


def tfmot_refusal(model):
    """Why TF-MOT cannot take `model` (one phrase), or None when it can.

    TF-MOT takes tf_keras Sequential and functional models, and Keras 3 ones
    the bridge translates; not subclassed models, nor Keras 3 models with
    custom layers (KerasHub's included), Lambda layers or raw ops.
    """
    if is_keras3_object(model):
        try:
            bad = untranslatable_layers(model)
        except UnsupportedLayerError as e:
            return first_line(e)
        if bad:
            return (f"{len(bad)} layer(s) the tf_keras bridge cannot translate: "
                    + ", ".join(f"{name} ({cls})" for name, cls, _ in bad[:3])
                    + (", ..." if len(bad) > 3 else ""))
        return None
    if isinstance(model, keras.Model) and not _compat.is_graph_network(model):
        return f"a subclassed model ({type(model).__name__})"
    return None


def choose_method(model, config=PruneConfig(), method="auto"):
    """'tfmot' or 'native': how `prune_to_sparsity` prunes `model`.

    'auto' is TF-MOT when it can take the model (`tfmot_refusal` is None: what
    worked before keeps working the same way), `magnitude` otherwise.

    Raises:
      ConfigError: an unknown method, or an option only TF-MOT has with 'native'.
      UnsupportedLayerError: 'auto' on a model TF-MOT cannot take, with an
        option only TF-MOT has (block_size, policy).
    """
    if method not in PRUNING_METHODS:
        raise ConfigError(f"method={method!r}: use one of {', '.join(PRUNING_METHODS)}")
    tfmot_only = []
    if tuple(config.block_size) != (1, 1):
        tfmot_only.append(f"block_size={tuple(config.block_size)}")
    if config.policy is not None:
        tfmot_only.append(f"policy={config.policy!r}")
    if method == "native" and tfmot_only:
        raise ConfigError(f"{', '.join(tfmot_only)} is TF-MOT's: use method='tfmot', or drop "
                          "it to prune natively")
    if method != "auto":
        return method
    why = tfmot_refusal(model)
    if why is None:
        return "tfmot"
    if tfmot_only:
        raise UnsupportedLayerError(
            f"{', '.join(tfmot_only)} needs TF-MOT, which cannot take model {model.name!r} "
            f"({why}): drop it to prune the model without TF-MOT (method='native')")
    return "native"


def prune_to_sparsity(model, target_sparsity, epochs, steps_per_epoch, config=PruneConfig(), *,
                      logdir=None, backup_dir=None, backup_freq="epoch",
                      delete_backup_after_fit=True, log_dir=None, method="auto"):
    """Prepares `model` for pruning to `target_sparsity` over `epochs` of fine-tuning.

    Returns a pruned copy (not compiled: compile it in the same strategy scope)
    and the callbacks to pass to `fit`. The layers pruned and those left dense
    are logged (see `plan_pruning`). Call it inside `strategy.scope()` to train
    distributed, after `set_precision` to train in mixed precision.

    A model TF-MOT cannot take (`tfmot_refusal`: Keras 3 custom layers such as
    KerasHub's, raw ops, subclassed models) is pruned by
    `magnitude.prune_magnitude` instead, with the same schedule and the same
    `config` (include/exclude, min_weights, keep_first_conv, m_by_n): then the
    model returned is `model` itself, in its own Keras, never copied or
    wrapped (compile it, or keep its compilation), its kernels found inside
    custom layers ('outer/inner' paths), and `strip_pruning` bakes the masks in.

    Example:

        with strategy.scope():
            pruned, callbacks = prune_to_sparsity(model, 0.8, 20, steps_per_epoch=20)
            training.compile_classifier(pruned, training.make_optimizer("adam", 1e-3))
        pruned.fit(train_ds, epochs=20, callbacks=callbacks)

    Args:
      model: a trained Sequential or functional tf_keras or Keras 3 model (e.g.
        loaded from a .keras file or SavedModel). A Keras 3 model is translated
        to tf_keras first (`tfaccel.keras.bridge.to_tf_keras`, verified); the
        pruned copy is tf_keras either way.
      target_sparsity: share of zeros to reach in each pruned layer, in [0, 1)
        (with `config.m_by_n` the pattern decides: m/n).
      epochs: epochs you will fit for.
      steps_per_epoch: optimizer steps per epoch.
      config: a `PruneConfig`.
      logdir: if given, per-layer sparsity goes to TensorBoard there each epoch
        (`SparsityLogger`).
      backup_dir: if given, the run is backed up there (`tfaccel.train.resume`) and
        a rerun after a kill resumes with its pruning step, masks and optimizer.
      backup_freq: 'epoch' or a number of steps between backups.
      delete_backup_after_fit: delete the backup when `fit` returns. Pass False
        when results are written after `fit`, and call `resume.remove_backup`
        after the last one, so that a kill in between does not lose the pruning.
      log_dir: the former name of `logdir`, still accepted.
      method: 'auto' (TF-MOT when it can take the model, else native), 'tfmot'
        (TF-MOT's wrappers; refuses what it cannot take) or 'native'
        (`magnitude`, any model; no block_size or policy).

    Returns:
      (pruned_model, callbacks).

    Raises:
      ConfigError: bad sparsity, schedule, layer names or method; both `logdir` and
        `log_dir`.
      UnsupportedLayerError: an included layer that cannot take the requested
        pattern; with method='tfmot', a subclassed model, or for a Keras 3 model
        every layer the bridge cannot translate (custom layers, Lambda).
    """
    if log_dir is not None:
        if logdir is not None:
            raise ConfigError(f"logdir={logdir!r} and log_dir={log_dir!r} both given: pass "
                              "only logdir (log_dir is its former name)")
        logdir = log_dir
    flavour = flavour_of(model)
    chosen = choose_method(model, config, method)
    if chosen == "tfmot":
        try:
            model = as_tf_keras(model)
        except ModelError as e:  # a Keras 3 model whose translation computes another model
            if method != "auto":
                raise
            logging.warning("pruning %s without TF-MOT: %s", model.name, first_line(e))
            chosen = "native"
    if chosen == "native":
        return _prune_natively(model, target_sparsity, epochs, steps_per_epoch, config,
                               logdir=logdir, backup_dir=backup_dir, backup_freq=backup_freq,
                               delete_backup_after_fit=delete_backup_after_fit)
    plan = plan_pruning(model, config)
    schedule = make_pruning_schedule(target_sparsity, epochs, steps_per_epoch, config)
    params = {"pruning_schedule": schedule, "block_pooling_type": config.block_pooling,
              "sparsity_m_by_n": tuple(config.m_by_n) if config.m_by_n else None}

    pruned_names = set(plan.pruned)

    def wrap(layer, new):
        if layer.name not in pruned_names:
            return new
        block = (1, 1) if layer.name in plan.element_wise else tuple(config.block_size)
        return _compat.pruning_wrapper_class()(new, block_size=block, **params)

    try:
        pruned = clone_with_weights(model, wrap=wrap)  # built in the current scope
    except ValueError as e:
        raise ModelError(f"TF-MOT cannot prune {model.name!r}: {first_line(e)}") from None
    _mask_in_float32(pruned)
    target = config.m_by_n[0] / config.m_by_n[1] if config.m_by_n else target_sparsity
    logging.info("pruning %s to %.0f%%: %s; left dense: %s", model.name, 100 * target,
                 ", ".join(plan.pruned),
                 "; ".join(f"{k} ({v})" for k, v in plan.skipped.items()) or "none")
    if plan.element_wise:
        logging.info("blocks of %s fit only 2-D kernels: %s pruned element-wise",
                     "x".join(map(str, config.block_size)), ", ".join(plan.element_wise))
    callbacks = []
    if backup_dir:
        callbacks += resume.backup_callbacks(backup_dir, backup_freq, epochs,
                                             delete_after_fit=delete_backup_after_fit)
    # Without UpdatePruningStep the wrappers fail at the first step and never update masks.
    callbacks.append(tfmot().sparsity.keras.UpdatePruningStep())
    if logdir:
        callbacks.append(SparsityLogger(logdir))
    _MADE_FROM[pruned] = flavour
    return pruned, callbacks


def _prune_natively(model, target_sparsity, epochs, steps_per_epoch, config, *, logdir,
                    backup_dir, backup_freq, delete_backup_after_fit):
    """`prune_to_sparsity` by `magnitude.prune_magnitude`: the model itself, its callbacks."""
    kind, args = pruning_schedule_args(target_sparsity, epochs, steps_per_epoch, config)
    schedule = magnitude.schedule_from({"class_name": kind, "config": args})
    _, callbacks = magnitude.prune_magnitude(
        model, schedule=schedule, m_by_n=config.m_by_n, include=config.include,
        exclude=config.exclude, min_weights=config.min_weights,
        keep_first_conv=config.keep_first_conv)
    if backup_dir:  # after the pruning callback: a backup holds the weights masked
        callbacks += resume.backup_callbacks(backup_dir, backup_freq, epochs,
                                             delete_after_fit=delete_backup_after_fit,
                                             flavour=flavour_of(model))
    if logdir:
        callbacks.append(SparsityLogger(logdir))
    return model, callbacks


def apply_masks(model):
    """Multiplies every pruned weight by its mask now (TF-MOT only does it per step and epoch)."""
    for layer in pruning_wrappers(model):
        for weight, mask, _ in layer.pruning_vars:
            weight.assign(tf.cast(weight.read_value() * tf.cast(mask.read_value(), weight.dtype),
                                  weight.dtype))
    return model


def strip_pruning(model, float32=False, flavour=None):
    """`model` without pruning wrappers: the same layers as before pruning, weights sparse.

    Returns the model in the Keras it was given to `prune_to_sparsity` in: a
    Keras 3 model's pruned copy comes back as a Keras 3 model (translated by
    `tfaccel.keras.bridge.to_keras3`, which checks that it computes the same).
    A model pruned without TF-MOT (`method='native'`, any Keras 3 model) is
    returned itself with its masks baked in (`magnitude.strip_magnitude`).

    Example:

        small3 = strip_pruning(pruned)                       # Keras 3 if model3 was
        small3 = strip_pruning(load_pruned_model("mid.keras"), flavour="keras3")

    Args:
      model: a model from `prune_to_sparsity` (after `fit`), or `load_pruned_model`.
      float32: also rebuild a mixed precision model in float32 (for export).
      flavour: 'tf_keras' or 'keras3', the Keras of the returned model; default:
        that of the model given to `prune_to_sparsity` (tf_keras for a model it
        did not make, e.g. one loaded from a file).

    Returns:
      A new, uncompiled model.

    Raises:
      ConfigError: unknown `flavour`.
      ModelError / UnsupportedLayerError: the Keras 3 translation fails its check.
    """
    if flavour is not None:
        check_flavour(flavour)
    if prunable.active_pruning(model) is not None or is_keras3_object(model):
        stripped = magnitude.strip_magnitude(model)
        if float32:
            stripped = apply_precision(stripped, "float32")
        return to_flavour(stripped, flavour)
    ensure_tf_keras(model)
    flavour = flavour or _MADE_FROM.get(model, "tf_keras")
    apply_masks(model)
    stripped = tfmot().sparsity.keras.strip_pruning(model)
    if float32:
        stripped = apply_precision(stripped, "float32")
    return to_flavour(stripped, flavour)


def load_pruned_model(path):
    """Loads a model saved with its pruning wrappers (e.g. a .keras or .h5 file saved mid-run).

    The wrappers come back with their weights, masks, thresholds, pruning step
    and schedule, masking in float32 as `prune_to_sparsity`'s do, so the model
    trains on: compile it and fit with `UpdatePruningStep` (TF-MOT's callback,
    the one `prune_to_sparsity` returns). TF-MOT does not save `m_by_n` in the
    wrapper's config: keep pruning a 2:4 model from a backup (`backup_dir`)
    instead of from such a file.

    Example:

        pruned.save("mid_run.keras")
        model = load_pruned_model("mid_run.keras")
        training.compile_classifier(model, training.make_optimizer("adam", 1e-3))
        model.fit(train_ds, epochs=2, callbacks=[tfmot.sparsity.keras.UpdatePruningStep()])

    Args:
      path: a .keras or .h5 file or a SavedModel directory holding a pruned model.

    Returns:
      The model, uncompiled, with its pruning wrappers.

    Raises:
      ModelError: the file is missing or cannot be loaded, or holds no pruning wrappers.
    """
    with tfmot().sparsity.keras.prune_scope():
        model = load_model_file(path)
    if not pruning_wrappers(model):
        raise ModelError(f"{path!r} holds no pruning wrappers: load it with load_model_file, "
                         "or prune it with prune_to_sparsity")
    return _mask_in_float32(model)
