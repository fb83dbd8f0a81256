"""The bridge between Keras 3 and tf_keras: the same model in the other Keras, verified.

TF-MOT prunes and quantization-aware trains tf_keras models only. `to_tf_keras`
translates a Keras 3 Sequential or functional model built from standard layers
into the equivalent tf_keras model: the architecture through its config
(`tfaccel.keras.translate` says what differs between the two Kerases), the
weights copied layer by layer. `to_keras3` is the way back (e.g. for a pruned
model after `strip_pruning`). Every crossing is checked: both models run on
sample inputs (yours, or random ones of the model's input shape) and their
outputs must agree within `atol`, or the bridge raises instead of handing you a
different model. Outputs apart in float32 are checked again with both models
rebuilt to compute in float64: a deep net can amplify float32 rounding into a
different prediction (Keras 3 EfficientNetB0 on random inputs: a quarter of its
largest logit, as far as from itself run one example at a time), while its
translation agrees in float64; a refusal names the first layer that differs there.
A model it cannot translate gets one error listing every such
layer (custom layer classes, Lambda, raw ops such as ``x * 2``) with the fix.

The prune and QAT helpers (`tfaccel.compress`) call it for you: a Keras 3 model
given to `prune_to_sparsity` is pruned as tf_keras, and `strip_pruning`
returns it as Keras 3 again.

Example:

    from tfaccel.keras import bridge, keras3

    k3 = keras3()                                 # what `import keras` gives: Keras 3
    inputs = k3.Input((8, 8, 1))
    x = k3.layers.Conv2D(8, 3, activation="relu")(inputs)
    outputs = k3.layers.Dense(10)(k3.layers.Flatten()(x))
    model3 = k3.Model(inputs, outputs)
    model2 = bridge.to_tf_keras(model3)           # tf_keras, same outputs within 1e-5
    again = bridge.to_keras3(model2)              # Keras 3 again
    bridge.max_difference(model3, again)          # e.g. 0.0
"""

import numpy as np
import tensorflow as tf
from absl import logging

from tfaccel import _compat
from tfaccel.errors import ModelError, UnsupportedLayerError, first_line
from tfaccel.keras import check_flavour, flavour_of, keras, keras3, translate

_FIX = ("ways out: rebuild those parts from standard Keras layers (e.g. a Lambda or `x * 2` "
        "-> keras.layers.Rescaling(2.0), an op -> its layer, such as keras.layers.Add or "
        "Activation), or build the model in tf_keras (`from tfaccel.keras import keras`), "
        "which TF-MOT takes as it is")
_HINTS = {  # tf_keras wrappers that have no Keras 3 form, and what to do with them
    "PruneLowMagnitude": "a pruning wrapper: call tfaccel.strip_pruning first",
    "QuantizeWrapper": "a QAT wrapper: a QAT model stays tf_keras (convert_to_tflite takes it)",
    "QuantizeWrapperV2": "a QAT wrapper: a QAT model stays tf_keras (convert_to_tflite takes it)",
    "QuantizeLayer": "a QAT layer: a QAT model stays tf_keras (convert_to_tflite takes it)",
}


class _Side:
    """One Keras as the bridge sees it: its module, how to check a model's graph, its name."""

    def __init__(self, flavour):
        self.flavour = flavour
        self.name = "Keras 3" if flavour == "keras3" else "tf_keras"
        self.module = keras3() if flavour == "keras3" else keras

    def is_graph(self, model):
        if self.flavour == "keras3":
            return isinstance(model, self.module.Sequential) or _compat.is_keras3_functional(model)
        return _compat.is_graph_network(model)

    def operations(self, model):
        if self.flavour == "keras3" and not isinstance(model, self.module.Sequential):
            return _compat.keras3_operations(model)
        return list(model.layers)


def _untranslatable_calls(model, source, target, prefix=""):
    """[(name, class, reason)] of the operations in `model` that `target` has no layer for."""
    bad = []
    for op in source.operations(model):
        kind = type(op).__name__
        name = prefix + getattr(op, "name", kind)
        if isinstance(op, source.module.Model):
            if not source.is_graph(op):
                bad.append((name, kind, "a subclassed model nested inside"))
            else:
                bad += _untranslatable_calls(op, source, target, prefix=f"{name}/")
        elif not isinstance(op, source.module.layers.Layer):
            bad.append((name, kind, "a raw operation, not a layer"))
        elif kind == "Lambda":
            bad.append((name, kind, "a Lambda is code, which no config carries across"))
        elif type(op) is not getattr(source.module.layers, kind, None):
            bad.append((name, kind, _HINTS.get(kind, "a custom layer class")))
        elif not hasattr(target.module.layers, kind):
            bad.append((name, kind, f"{target.name} has no {kind} layer"))
    return bad


def _untranslatable_configs(config, direction, target, prefix=""):
    """[(name, class, reason)] of the layer configs `target` cannot rebuild."""
    bad = []
    for entry in config["layers"]:
        kind, name = entry["class_name"], prefix + entry.get("name", entry["config"].get("name"))
        if kind in translate.MODEL_CLASSES:
            bad += _untranslatable_configs(entry["config"], direction, target, f"{name}/")
            continue
        try:
            translated = translate.layer_entry(entry, direction)
            if kind != "InputLayer":  # built when the model is; its config is checked there
                getattr(target.module.layers, kind).from_config(translated["config"])
        except (translate.Untranslatable, TypeError, ValueError) as e:
            bad.append((name, kind, _reason(e)))
    return bad


def _reason(error):
    """The cause in a Keras error ("Error when deserializing class X using config=...")."""
    text = str(error)
    if "Exception encountered:" in text:
        text = text.rpartition("Exception encountered:")[2]
    return first_line(text)


def untranslatable_layers(model):
    """[(layer name, class name, reason)] of what keeps `model` from crossing to the other Keras.

    Empty when `to_tf_keras` (for a Keras 3 model) or `to_keras3` (for a
    tf_keras one) can translate it. Nested models' layers are named
    'inner/layer'.

    Raises:
      UnsupportedLayerError: a subclassed model (it has no graph to translate).
    """
    source, target, direction = _sides(model)
    _check_graph(model, source)
    bad = _untranslatable_calls(model, source, target)
    if not bad:  # a layer the target has can still hold options it lacks
        bad = _untranslatable_configs(model.get_config(), direction, target)
    return bad


def untranslatable_parts(model):
    """`untranslatable_layers(model)`, a subclassed model counted as one entry (its name, its
    class, 'subclassed') instead of raised: what a helper refusing such a model lists."""
    try:
        return untranslatable_layers(model)
    except UnsupportedLayerError:
        return [(getattr(model, "name", "model"), type(model).__name__, "subclassed")]


def _sides(model):
    if flavour_of(model) == "keras3":
        return _Side("keras3"), _Side("tf_keras"), translate.TO_TF_KERAS
    return _Side("tf_keras"), _Side("keras3"), translate.TO_KERAS3


def _check_graph(model, source):
    if not isinstance(model, source.module.Model) or not source.is_graph(model):
        raise UnsupportedLayerError(
            f"model {getattr(model, 'name', model)!r} is a subclassed {type(model).__name__}: "
            f"the bridge translates Sequential and functional {source.name} models only; "
            "rebuild it with keras.Input and layer calls")
    if not model.built or not model.inputs:
        raise ModelError(f"model {model.name!r} has no inputs yet: start it with keras.Input(...) "
                         "(or build it) before translating it")


# ---------------------------------------------------------------- weights and checks


def _short(variable):
    return variable.name.rpartition("/")[2].partition(":")[0]


def _copy_weights(source_model, target_model):
    """Sets every layer of `target_model` to the weights of the same-named layer of the source."""
    for layer in target_model.layers:
        if not layer.weights:
            continue
        old = source_model.get_layer(layer.name)
        if isinstance(layer, (keras.Model, keras3().Model)):
            _copy_weights(old, layer)
            continue
        values = {_short(v): np.asarray(v.numpy()) for v in old.weights}
        names = [_short(v) for v in layer.weights]
        if sorted(values) == sorted(names) and len(set(names)) == len(names):
            arrays = [values[n] for n in names]
        else:  # names differ between the Kerases: the same creation order
            arrays = [np.asarray(v.numpy()) for v in old.weights]
        layer.set_weights(arrays)


def sample_inputs(model, batch_size=8, seed=0):
    """Random inputs of `model`'s input shapes (normal floats; 0/1 for integer inputs).

    Raises:
      ModelError: an input dimension other than the batch is unknown (pass `sample`).
    """
    rng = np.random.default_rng(seed)
    arrays = []
    for ref in model.inputs:
        shape = [None if d is None else int(d) for d in tuple(ref.shape)[1:]]
        if None in shape:
            raise ModelError(f"input {ref.name!r} of {model.name!r} has unknown dimensions "
                             f"{tuple(ref.shape)}: pass sample=<arrays of real inputs>")
        dtype = np.dtype(getattr(ref.dtype, "as_numpy_dtype", ref.dtype))
        if np.issubdtype(dtype, np.integer):
            arrays.append(rng.integers(0, 2, (batch_size, *shape)).astype(dtype))
        else:
            arrays.append(rng.standard_normal((batch_size, *shape)).astype(dtype))
    return arrays


def _as_inputs(model, sample):
    if sample is None:
        arrays = sample_inputs(model)
    elif isinstance(sample, tf.data.Dataset):
        batch = next(iter(sample.take(1)))
        x = batch[0] if isinstance(batch, tuple) else batch
        arrays = [np.asarray(t) for t in tf.nest.flatten(x)]
    else:
        arrays = [np.asarray(a) for a in (sample if isinstance(sample, (list, tuple)) else
                                          [sample])]
    return arrays[0] if len(arrays) == 1 else arrays


def max_difference(model_a, model_b, sample=None):
    """The largest absolute difference between two models' outputs (inference mode) on `sample`.

    Args:
      model_a, model_b: models of either Keras with the same inputs and outputs.
      sample: an array, a list of arrays (one per input) or a `tf.data.Dataset`
        (its first batch); default: `sample_inputs(model_a)`.

    Raises:
      ModelError: the models' outputs differ in number or shape.
    """
    inputs = _as_inputs(model_a, sample)
    outputs = [[np.asarray(o, np.float32) for o in tf.nest.flatten(m(inputs, training=False))]
               for m in (model_a, model_b)]
    shapes = [[o.shape for o in out] for out in outputs]
    if shapes[0] != shapes[1]:
        raise ModelError(f"{model_a.name!r} and {model_b.name!r} give outputs of shapes "
                         f"{shapes[0]} and {shapes[1]}: they are not the same model")
    return max((float(np.max(np.abs(a - b))) for a, b in zip(*outputs) if a.size), default=0.0)


def _largest_output(model, sample):
    """The largest |output| of `model` on `sample`: the scale float32 rounding grows with."""
    outputs = tf.nest.flatten(model(_as_inputs(model, sample), training=False))
    return max((float(np.max(np.abs(np.asarray(o, np.float32)))) for o in outputs
                if np.size(o)), default=0.0)


def _cross(model, flavour_wanted, sample, atol, rtol=1e-5):
    source, target, direction = _sides(model)
    if source.flavour == flavour_wanted:
        raise ModelError(f"model {model.name!r} is already a {source.name} model: "
                         f"to_{flavour_wanted} translates {target.name} models")
    bad = untranslatable_layers(model)
    if bad:
        listed = "; ".join(f"{name} ({kind}: {why})" for name, kind, why in bad)
        raise UnsupportedLayerError(
            f"the bridge cannot translate {len(bad)} layer(s) of {model.name!r} to {target.name}, "
            f"so it would not be the same model: {listed}; {_FIX}")
    config = translate.model_config(model.get_config(), direction)
    cls = target.module.Sequential if isinstance(model, source.module.Sequential) else \
        target.module.Model
    try:
        translated = cls.from_config(config)
    except (TypeError, ValueError, KeyError) as e:
        raise ModelError(f"{target.name} cannot rebuild {model.name!r} from its translated "
                         f"config: {first_line(e, with_type=True)}") from None
    _copy_weights(model, translated)
    difference = max_difference(model, translated, sample)
    if not difference <= _allowed(model, sample, atol, rtol):
        exact, culprit = _float64_check(model, translated, (source, target), sample, atol, rtol)
        if exact is None or culprit is not None:
            raise _refusal(model, target, difference, atol, rtol, culprit)
        logging.warning("bridged %r to %s: outputs %.3g apart in float32 but within %.3g when "
                        "both compute in float64: the model amplifies float32 rounding; the "
                        "translation is the same model", model.name, target.name, difference,
                        exact)
        return translated
    logging.info("bridged %r to %s: outputs within %.3g", model.name, target.name, difference)
    return translated


def _allowed(model, sample, atol, rtol):
    return atol + rtol * _largest_output(model, sample) if rtol else atol


def _refusal(model, target, difference, atol, rtol, culprit):
    where = f" (in float64 too, first from layer {culprit})" if culprit else ""
    return ModelError(
        f"the {target.name} translation of {model.name!r} gives outputs up to {difference:.3g} "
        f"away from the original (atol={atol}, rtol={rtol}){where}: the bridge refuses a "
        "different model (tfaccel's limit; pass a larger atol only if the model computes in "
        "float16/bfloat16); what works on the model as it is: prune_to_sparsity(..., "
        "method='native'), keras3_quantized(model, 'int8'), convert_to_tflite(model, ...), "
        "data parallelism (--strategy=mirrored)")


# ---------------------------------------------------------------- the float64 check


def _float64_check(model, translated, sides, sample, atol, rtol):
    """(difference, culprit) of `model` and its translation both rebuilt to compute in float64.

    A deep net can amplify float32 rounding (the order of a sum differs between the two
    Kerases' kernels) into outputs far apart, as Keras 3 EfficientNetB0 does on random
    inputs: it differs as much from itself run one example at a time. In float64 the same
    model's two forms agree to rounding, and a translation error stays. The culprit is
    '<layer name> (<class>)', the first layer whose float64 outputs differ, '' if none
    alone does, None if the models agree; (None, None) when a layer computes in float16 or
    bfloat16 (float32 is not its precision) or the copies cannot be built.
    """
    pair = [_in_float64(m, side) for m, side in zip((model, translated), sides)]
    if None in pair:
        return None, None
    inputs = _as_float64(_as_inputs(model, sample))
    difference = max_difference(*pair, sample=inputs)
    if difference <= _allowed(pair[0], inputs, atol, rtol):
        return difference, None
    return difference, _first_different_layer(pair, sides, inputs, atol, rtol)


def _in_float64(model, side):
    """A copy of `model` (of `side`'s Keras) that computes in float64, with its weights;
    None when a layer computes in float16/bfloat16 or the copy cannot be built."""
    try:
        config = translate.in_float64(model.get_config())
        cls = side.module.Sequential if isinstance(model, side.module.Sequential) else \
            side.module.Model
        copy = cls.from_config(config)
    except (translate.Untranslatable, TypeError, ValueError, KeyError):
        return None
    _copy_weights(model, copy)
    return copy


def _as_float64(inputs):
    arrays = inputs if isinstance(inputs, list) else [inputs]
    cast = [a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a for a in arrays]
    return cast if isinstance(inputs, list) else cast[0]


def _first_different_layer(pair, sides, inputs, atol, rtol):
    """'<name> (<class>)' of the first top-level layer whose outputs differ between the two
    models (of the same layer names), or '' if none does alone."""
    names, ends = [], ([], [])
    for layer in pair[0].layers:
        if type(layer).__name__ == "InputLayer" or isinstance(layer, (keras.Model, keras3().Model)):
            continue
        try:  # tf_keras has no one output for a layer called twice (shared)
            found = [m.get_layer(layer.name).output for m in pair]
        except (AttributeError, ValueError):
            continue
        if not any(isinstance(end, (list, tuple, dict)) for end in found):
            names.append(layer.name)
            for end, own in zip(found, ends):
                own.append(end)
    if not names:
        return ""
    probes = [side.module.Model(m.inputs, own) for m, side, own in zip(pair, sides, ends)]
    values = [[np.asarray(o, np.float64) for o in tf.nest.flatten(probe(inputs, training=False))]
              for probe in probes]
    for name, a, b in zip(names, *values):
        if a.shape != b.shape or not np.max(np.abs(a - b), initial=0.0) <= \
                atol + rtol * np.max(np.abs(a), initial=0.0):
            return f"{name!r} ({type(pair[0].get_layer(name)).__name__})"
    return ""


def to_tf_keras(model3, sample=None, atol=1e-5, rtol=1e-5):
    """The tf_keras equivalent of a Keras 3 Sequential or functional model, verified.

    Example:

        model2 = to_tf_keras(model3, sample=x_test[:32])

    Args:
      model3: a built Keras 3 Sequential or functional model of standard layers
        (nested Sequential/functional models are translated too).
      sample: inputs to compare the two models on (see `max_difference`);
        default: 8 random inputs of the model's input shapes.
      atol, rtol: the translation is accepted when its outputs differ from the
        original's by at most atol + rtol x the original's largest |output|
        (float32 rounding grows with the outputs: a deep random-init network's
        logits of thousands differ by thousandths; rtol=0: atol alone), in
        float32 or, when float32 rounding is amplified past that, with both
        models computing in float64.

    Returns:
      A new, uncompiled tf_keras model with the same layer names and weights.

    Raises:
      UnsupportedLayerError: layers it cannot translate (all listed), or a subclassed model.
      ModelError: not a Keras 3 model, or the translation's outputs differ by more than that.
    """
    return _cross(model3, "tf_keras", sample, atol, rtol)


def to_keras3(model2, sample=None, atol=1e-5, rtol=1e-5):
    """The Keras 3 equivalent of a tf_keras Sequential or functional model, verified.

    The way back from `to_tf_keras`, e.g. for a pruned model after
    `strip_pruning` (wrappers must be stripped first; a QAT model has no Keras 3
    form). Arguments, returns and errors as `to_tf_keras`, the other way round.
    """
    return _cross(model2, "keras3", sample, atol, rtol)


def to_flavour(model, flavour, sample=None, atol=1e-5, rtol=1e-5):
    """`model` in Keras `flavour` ('tf_keras', 'keras3'; None: as it is), translated if need be.

    A model already of that Keras is returned as it is; one of the other Keras
    comes back as its verified translation (`to_tf_keras`, `to_keras3`).

    Raises:
      ConfigError: an unknown flavour.
      UnsupportedLayerError, ModelError: as `to_tf_keras`.
    """
    if flavour is None or flavour_of(model) == check_flavour(flavour):
        return model
    return _cross(model, flavour, sample, atol, rtol)


def as_tf_keras(model, sample=None, atol=1e-5, rtol=1e-5):
    """`model` if it is tf_keras, its verified tf_keras translation if it is Keras 3.

    What the TF-MOT helpers call on the model they are given.
    """
    return to_flavour(model, "tf_keras", sample, atol, rtol)
