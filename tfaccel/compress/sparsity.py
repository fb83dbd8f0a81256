"""Measuring pruning: zeros counted in the weights, 2:4 checks, and what they save on disk.

Everything here reads the weights themselves (not TF-MOT's masks or its
schedule), so it works on a pruned model during training, on a stripped one,
and on one loaded back from a file; on TF-MOT's wrapped tf_keras models and on
any model `tfaccel.compress.magnitude` prunes, Keras 3 and custom layers
included (their kernels found by `tfaccel.compress.prunable`, read in place).

Example:

    from tfaccel.compress import sparsity

    report = sparsity.sparsity_report(stripped, layer_names=plan.pruned)
    report["pruned"]["sparsity"]                     # e.g. 0.8000
    sparsity.check_m_by_n(stripped, (2, 4), plan.pruned)["dense"]["violations"]   # 0
    sparsity.model_sizes(stripped, "out/pruned")["h5"]["gzip_bytes"]
"""

import os

import numpy as np
import tensorflow as tf

from tfaccel import summaries
from tfaccel.compress import prunable
from tfaccel.compress.pruning_plan import (
    is_pruning_wrapper,
    prunable_weights,
    pruning_step,
    pruning_wrappers,
    registry_supports,
    walk_layers,
)
from tfaccel.compress.tflite import convert_to_tflite
from tfaccel.errors import ConfigError, ModelError
from tfaccel.io import atomic_path, file_size, gzipped_size
from tfaccel.keras import clone_with_weights, is_keras3_object
from tfaccel.keras.bridge import as_tf_keras
from tfaccel.train.precision import apply_precision

_PRUNED_ZEROS = 0.01
"""Share of exact zeros above which a kernel of a stripped model counts as pruned."""

_NO_AXIS = "no input axis"
"""The 2:4 axis of a kernel that has none (an embedding table, a depthwise kernel)."""


def _layers_with_kernels(model, wanted=()):
    """[(name, wrapped, [kernel arrays], [2:4 axes])], through wrappers, nested models and
    custom layers.

    A tf_keras layer TF-MOT's table knows gives the kernels TF-MOT prunes (as
    before), or, named in `wanted`, those `prunable` finds (a depthwise kernel);
    other layers (custom ones, every Keras 3 layer, any layer of a model
    `magnitude` is pruning) give what `prunable` finds, one row per layer path
    ('outer/inner' inside a custom layer).
    """
    def native(kernels):
        rows = {}
        for k in kernels:
            rows.setdefault(k.path, []).append(k)
        return [(path, False, [np.asarray(k.variable.numpy()) for k in ks],
                 [_NO_AXIS if k.axis is None else k.axis for k in ks])
                for path, ks in rows.items()]

    pruning = prunable.active_pruning(model)
    if is_keras3_object(model) or pruning is not None:
        found = prunable.find_kernels(model)[0]
        seen = {id(k.variable) for k in found}
        # Weights the caller passed to prune_magnitude(kernels=[...]) that no walk finds.
        extra = [k for k in (pruning.plan.kernels if pruning else ()) if id(k.variable) not in seen]
        return native(found + extra)
    out = []
    for layer in walk_layers(model):
        wrapped = is_pruning_wrapper(layer)
        inner = layer.layer if wrapped else layer
        weights = [w for w, _, _ in layer.pruning_vars] if wrapped else prunable_weights(inner)
        if weights:
            out.append((inner.name, wrapped, [np.asarray(w.numpy()) for w in weights],
                        [None] * len(weights)))
        elif inner.weights and (inner.name in wanted or not registry_supports(inner)):
            out += native(prunable.layer_kernels(inner, inner.name)[0])
    return out


def _summary(rows):
    weights = sum(r["weights"] for r in rows)
    zeros = sum(r["zeros"] for r in rows)
    return {"layers": len(rows), "weights": weights, "zeros": zeros,
            "sparsity": zeros / weights if weights else 0.0}


def sparsity_report(model, layer_names=None):
    """Per-layer and overall share of zero weights, counted in the kernels.

    Args:
      model: a pruned (wrapped) or stripped tf_keras model, or a Keras 3 one (read
        in place: custom layers' kernels are rows named 'outer/inner').
      layer_names: the layers that were pruned (e.g. `PruningPlan.pruned`,
        `KernelPlan.layers`); default: the wrapped layers of a pruned model, the
        planned layers of a model `magnitude.prune_magnitude` prunes, or, in a
        stripped or loaded one, the layers whose kernels are more than 1% exact zeros
        (float weights that were not masked hold almost none: a random init
        gives about one per 8 million). That reading is a guess from the
        weights: a kernel pruned to under 1% or one zero-initialized or made
        sparse by L1 is misjudged, so pass the names when you have them.

    Returns:
      {'layers': [{'layer', 'shape', 'weights', 'zeros', 'sparsity', 'pruned'}],
       'pruned': totals over the pruned layers, 'all_kernels': totals over every
       kernel, 'model': {'parameters', 'zeros', 'sparsity'} over all weights}.
    """
    native = prunable.active_pruning(model)
    if layer_names is None and native is not None:
        layer_names = native.plan.layers
    found = _layers_with_kernels(model, layer_names or ())
    if layer_names is None:
        wrapped = [name for name, w, _, _ in found if w]
        layer_names = wrapped or [name for name, _, kernels, _ in found
                                  if sum(np.count_nonzero(k == 0) for k in kernels)
                                  > _PRUNED_ZEROS * sum(k.size for k in kernels)]
    missing = set(layer_names) - {name for name, _, _, _ in found}
    if missing:
        raise ModelError(f"layers {', '.join(sorted(missing))} have no prunable kernel in "
                         f"{model.name!r}: pass the names of pruned layers")
    rows = []
    for name, _, kernels, _ in found:
        size = sum(k.size for k in kernels)
        zeros = sum(int(np.count_nonzero(k == 0)) for k in kernels)
        rows.append({"layer": name, "shape": "x".join(str(d) for d in kernels[0].shape),
                     "weights": size, "zeros": zeros, "sparsity": zeros / size,
                     "pruned": name in layer_names})
    wrapped = any(w for _, w, _, _ in found)
    all_weights = [a for v in model.weights
                   if not (wrapped and ("mask" in v.name or "threshold" in v.name))
                   for a in [np.asarray(v.numpy())] if np.issubdtype(a.dtype, np.floating)]
    params = sum(w.size for w in all_weights)
    zeros = sum(int(np.count_nonzero(w == 0)) for w in all_weights)
    return {"layers": rows, "pruned": _summary([r for r in rows if r["pruned"]]),
            "all_kernels": _summary(rows),
            "model": {"parameters": params, "zeros": zeros, "sparsity": zeros / max(params, 1)}}


def m_by_n_violations(kernel, m_by_n=(2, 4), axis=None):
    """(groups, violations): groups of n consecutive input-channel weights with fewer than m zeros.

    Groups run along the input-channel axis (axis -2 of Dense and Conv2D
    kernels), as TF-MOT and TFLite's 2:4 kernels lay them out; `axis` names
    another input axis (any rank), e.g. `prunable.Kernel.axis`.
    """
    m, n = m_by_n
    kernel = np.asarray(kernel)
    if axis is None and kernel.ndim not in (2, 4):
        raise ModelError(f"{m}:{n} sparsity is defined for 2-D and 4-D kernels, not {kernel.shape}")
    axis = -2 if axis is None else axis
    channels = kernel.shape[axis]
    if channels % n:
        raise ModelError(f"a kernel of shape {kernel.shape} has {channels} input channels, not a "
                         f"multiple of {n}: it cannot hold {m}:{n} sparsity")
    rows = np.moveaxis(kernel, axis, -1).reshape(-1, channels // n, n)
    zeros = np.count_nonzero(rows == 0, axis=-1)
    return int(zeros.size), int(np.count_nonzero(zeros < m))


def check_m_by_n(model, m_by_n=(2, 4), layer_names=None):
    """{layer: {'groups', 'violations', 'ok'}} of the m:n pattern in each pruned kernel.

    Args:
      model: a pruned or stripped model, e.g. loaded back from the saved file (either
        Keras; a magnitude-pruned kernel is checked along its own input axis).
      m_by_n: (m, n), e.g. (2, 4).
      layer_names: the pruned layers; default as in `sparsity_report`.
    """
    if len(tuple(m_by_n)) != 2 or not 0 < m_by_n[0] < m_by_n[1]:
        raise ConfigError(f"m_by_n={m_by_n!r} must be two integers 0 < m < n, e.g. (2, 4)")
    report = sparsity_report(model, layer_names)
    names = {r["layer"] for r in report["layers"] if r["pruned"]}
    out = {}
    for name, _, kernels, axes in _layers_with_kernels(model, tuple(names)):
        if name in names:
            groups = violations = 0
            for k, axis in zip(kernels, axes):
                if axis == _NO_AXIS:  # not pruned to the pattern (listed in the plan)
                    continue
                g, v = m_by_n_violations(k, m_by_n, axis)
                groups, violations = groups + g, violations + v
            out[name] = {"groups": groups, "violations": violations, "ok": violations == 0}
    return out


def save_without_optimizer(model, path):
    """Saves `model` as .h5 or .keras with no optimizer state (the fair file to compare)."""
    with atomic_path(path) as tmp:
        if str(path).endswith(".keras"):
            # The .keras format always writes a compiled model's optimizer: save an uncompiled copy.
            clone_with_weights(model).save(tmp)
        else:
            model.save(tmp, include_optimizer=False)
    return path


def model_sizes(model, directory, name="model", tflite=True):
    """Raw and gzipped bytes of `model` saved as .h5 (no optimizer) and converted to TFLite.

    TFLite is converted twice: plain float, and with the converter's sparse
    weight encoding (`EXPERIMENTAL_SPARSITY`, which only pays off on pruned
    weights). A mixed precision model is measured as its float32 copy.

    Returns:
      {'h5': {'path', 'bytes', 'gzip_bytes'}, 'tflite': {...}, 'tflite_sparse': {...}}.
    """
    model = as_tf_keras(model)
    os.makedirs(directory, exist_ok=True)
    if any(layer.compute_dtype != "float32" for layer in model.layers):
        model = apply_precision(model, "float32")
    files = {"h5": save_without_optimizer(model, os.path.join(directory, f"{name}.h5"))}
    if tflite:
        files["tflite"] = convert_to_tflite(model, os.path.join(directory, f"{name}.tflite"))
        files["tflite_sparse"] = convert_to_tflite(
            model, os.path.join(directory, f"{name}_sparse.tflite"), optimize_sparsity=True)
    return {k: {"path": p, "bytes": file_size(p), "gzip_bytes": gzipped_size(p)}
            for k, p in files.items()}


class SparsityLogger(summaries.ScalarLogger):
    """Writes each pruned layer's measured sparsity, their total and the target to TensorBoard.

    For TF-MOT's pruning (`prune.prune_to_sparsity`) and `magnitude.prune_magnitude`'s alike.

    Tags: `sparsity/<layer>`, `sparsity/pruned_layers`, `sparsity/target` (the
    schedule's value at the current pruning step) and `pruning/step`, at each
    epoch end (step = epoch, as Keras's own epoch scalars).

    Args:
      logdir: TensorBoard log directory.

    Attributes:
      history: one {'epoch', 'sparsity/...': ..., 'pruning/step'} per epoch.
      start_step: the pruning step when `fit` started (after a resume: the restored one).
    """

    def __init__(self, logdir):
        super().__init__(logdir)
        self.history = []
        self.start_step = None

    def on_train_begin(self, logs=None):
        # Runs after BackupAndRestore and UpdatePruningStep (prune_to_sparsity's order).
        native = prunable.active_pruning(self.model)
        self.start_step = native.optimizer_steps() if native else pruning_step(self.model)

    def on_epoch_end(self, epoch, logs=None):
        native = prunable.active_pruning(self.model)
        wrappers = [] if native else pruning_wrappers(self.model)
        if native:  # tfaccel.compress.magnitude's pruning: no wrappers, its own clock
            step, target = native.step, native.target()
        elif wrappers:
            step = int(wrappers[0].pruning_step.numpy())
            schedule = wrappers[0].pruning_schedule
            target = float(schedule(tf.constant(step, tf.int64))[1].numpy())
            if wrappers[0].sparsity_m_by_n:
                m, n = wrappers[0].sparsity_m_by_n
                target = m / n
        else:
            return
        report = sparsity_report(self.model)
        values = {f"sparsity/{r['layer']}": r["sparsity"] for r in report["layers"] if r["pruned"]}
        values.update({"sparsity/pruned_layers": report["pruned"]["sparsity"],
                       "sparsity/target": target, "pruning/step": step})
        self.history.append({"epoch": epoch, **values})
        if logs is not None:
            logs["sparsity"] = report["pruned"]["sparsity"]
        self.write(values, step=epoch)
