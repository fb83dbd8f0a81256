"""Quantization-aware training (QAT) through TF-MOT, checked before it starts.

`quantize_aware` returns a copy of a tf_keras model that simulates int8
inference while it trains (fake-quant on weights and activations, with
Conv/Dense + BatchNorm patterns folded the way TF-MOT's default 8-bit scheme
does it). Fine-tune it a few epochs with the usual `compile`/`fit`, then
convert it with `tfaccel.compress.tflite.convert_to_tflite(..., mode="int8")`.

Before anything is cloned, every layer to quantize is checked against what the
default 8-bit scheme supports; unsupported ones (e.g. Lambda, LSTM) are listed
in one `UnsupportedLayerError` with the ways out. Nested models are flattened
first (TF-MOT refuses them, its issue #957). `check_quantize_aware` builds the
QAT model on a throwaway copy (pruned and stripped first, for the
prune-preserving path), so that a recipe meets every problem before training.
Under a mixed precision policy the QAT model is built and fine-tuned in
float32, with a warning, because the fake-quant kernels have no float16
version. Call it inside a
`tf.distribute.Strategy` scope to train it distributed.

A Keras 3 model is quantized through its tf_keras translation
(`tfaccel.keras.bridge`, checked to compute the same); the QAT model is tf_keras.

`scheme="prune_preserve"` uses TF-MOT's collaborative
`Default8BitPrunePreserveQuantizeScheme`, which keeps the zeros of a pruned
(and stripped) model through QAT; plain QAT fills them back in.

Example:

    from tfaccel.compress import quantize
    from tfaccel.train import training

    qat = quantize.quantize_aware(model)           # or scheme="prune_preserve"
    training.compile_classifier(qat, training.make_optimizer("adam", 1e-4))
    qat.fit(train_ds, epochs=2)    # a fresh QAT model scores ~10% until it trains
"""

import dataclasses

from absl import logging

from tfaccel import _compat
from tfaccel.compress import prune
from tfaccel.compress.pruning_plan import pruning_wrappers, tfmot
from tfaccel.errors import ConfigError, ModelError, UnsupportedLayerError, first_line
from tfaccel.keras import clone_with_weights, ensure_tf_keras, is_keras3_object, keras
from tfaccel.keras.bridge import as_tf_keras, untranslatable_parts
from tfaccel.train.precision import apply_precision, precision_scope

SCHEMES = ("default", "prune_preserve")
"""QAT schemes: TF-MOT's default 8-bit one, or its prune-preserving variant."""

# Layers the default 8-bit scheme handles through graph transforms rather than
# its registry: BatchNorm is folded into a linear Conv2D/DepthwiseConv2D/Dense
# before it (or a Conv2D/DepthwiseConv2D before a Reshape before it); separable
# convolutions are split.
_FOLDABLE_INTO_BN = ("Conv2D", "DepthwiseConv2D", "Dense")
_FOLDABLE_THROUGH_RESHAPE = ("Conv2D", "DepthwiseConv2D")
_TRANSFORMED = ("InputLayer", "SeparableConv1D", "SeparableConv2D")
# Weightless layers the registry lacks but int8 TFLite runs with its input's scale (as the
# registry's MaxPooling2D/ZeroPadding2D): annotated with a no-op config, so the output keeps
# the input's quantization. Resizing: the zoo's mobilenet_v2 upsamples small images with it.
_SAME_SCALE = ("Resizing",)


def _registry():
    return tfmot().quantization.keras.default_8bit.Default8BitQuantizeRegistry()


def _calls_in(model):
    """{layer name: [the layers feeding each of its calls]}, over the calls in `model`'s graph.

    A layer object can be called in several models: TF-MOT's `strip_pruning`
    returns the very layers of the pruned model (where a BatchNorm follows a
    pruning wrapper), and `flatten_model` calls a sub-model's layers again.
    Only the calls that make up `model` say what QAT will see.
    """
    calls = {}
    for layer, inbound in _compat.layer_calls(model):
        calls.setdefault(layer.name, []).append(inbound)
    return calls


def _follows(layer, kinds, calls):
    """True when every call of `layer` in the model takes the output of one layer of `kinds`."""
    inbound = calls.get(layer.name, [])
    return bool(inbound) and all(len(layers) == 1 and type(layers[0]).__name__ in kinds
                                 for layers in inbound)


def _follows_foldable_layer(layer, calls):
    """True when TF-MOT can fold the BatchNorm `layer` into the layer before it."""
    if _follows(layer, ("Reshape",), calls):
        reshape = calls[layer.name][0][0]
        return _follows(reshape, _FOLDABLE_THROUGH_RESHAPE, calls)
    return _follows(layer, _FOLDABLE_INTO_BN, calls)


def _is_supported(layer, registry, calls):
    kind = type(layer).__name__
    if kind in _TRANSFORMED or kind in _SAME_SCALE or registry.supports(layer):
        return True
    if kind in ("BatchNormalization", "SyncBatchNormalization"):
        return _follows_foldable_layer(layer, calls)
    return False


def unsupported_layers(model, layer_names=None):
    """[(name, type)] of the layers TF-MOT's default 8-bit scheme cannot quantize.

    Args:
      model: a flat tf_keras functional or Sequential model.
      layer_names: check only these layers (default: all).

    Returns:
      A list of (layer name, layer class name), empty when all are supported.
    """
    registry = _registry()
    calls = _calls_in(model)
    return [(layer.name, type(layer).__name__) for layer in model.layers
            if (layer_names is None or layer.name in layer_names)
            and not _is_supported(layer, registry, calls)]


def check_quantizable(model, layer_names=None):
    """Raises one UnsupportedLayerError listing every layer QAT cannot handle.

    Raises:
      UnsupportedLayerError: some layers are not supported, or the model is
        subclassed (TF-MOT needs a functional or Sequential graph).
    """
    ensure_tf_keras(model)
    if not _compat.is_graph_network(model):
        raise UnsupportedLayerError(
            f"model {model.name!r} is a subclassed {type(model).__name__}: QAT needs a "
            "functional or Sequential model; rebuild it with keras.Input and layer calls")
    bad = unsupported_layers(model, layer_names)
    if bad:
        listed = ", ".join(f"{name} ({kind})" for name, kind in bad)
        names = ",".join(name for name, _ in bad)
        norms = any(kind.endswith("BatchNormalization") for _, kind in bad)
        fold = ("a BatchNormalization is folded into the Conv2D/DepthwiseConv2D/Dense right "
                "before it, so put one there, or " if norms else "")
        raise UnsupportedLayerError(
            f"QAT (TF-MOT default 8-bit scheme) cannot quantize {len(bad)} layer(s): {listed}; "
            f"ways out: {fold}skip them (skip_layers=[...] / --qat_skip_layers={names}), "
            "quantize only "
            "a subset (only_layers=[...]), or replace them with supported layers "
            "(Conv2D, Dense, DepthwiseConv2D, pooling, Add, Concatenate, ReLU, Activation)")


# ---------------------------------------------------------------- flattening


def is_nested(model):
    """True when `model` holds another Keras model as a layer."""
    return any(isinstance(layer, keras.Model) for layer in model.layers)


def flatten_model(model):
    """A functional model with the same layers (and weights) and no nested models.

    Sub-models (functional or Sequential) are inlined layer by layer; the
    returned model shares its layers, hence its weights, with `model`.

    Raises:
      UnsupportedLayerError: a nested model is subclassed, or inlining makes
        two layers share a name.
    """
    ensure_tf_keras(model)
    if not is_nested(model):
        return model
    inputs = [keras.Input(shape=ref.shape[1:], dtype=ref.dtype, name=ref.name.split(":")[0])
              for ref in model.inputs]
    outputs = _compat.replay_layers(model, inputs)
    names = [layer.name for layer in _collect_layers(model)]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise UnsupportedLayerError(
            f"flattening nested model {model.name!r} for QAT gives duplicate layer names "
            f"{', '.join(clashes)}: give the inner layers unique names")
    return keras.Model(inputs, outputs[0] if len(outputs) == 1 else outputs, name=model.name)


def _collect_layers(model):
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _collect_layers(layer)
        elif not isinstance(layer, keras.layers.InputLayer):
            yield layer


# ---------------------------------------------------------------- precision


def is_mixed_precision(model):
    """True when the global policy or any layer of `model` computes in float16/bfloat16."""
    policies = [keras.mixed_precision.global_policy()] + [
        layer.dtype_policy for layer in model.layers]
    return any(p.compute_dtype in ("float16", "bfloat16") for p in policies)


# ---------------------------------------------------------------- QAT

QAT_ALTERNATIVES = (
    "what works for it: Keras 3's own int8/int4 (tfaccel.keras3_quantized(model, 'int8')) or "
    "post-training int8 TFLite (tfaccel.convert_to_tflite(model, path, mode='int8', "
    "representative_data=...))")
"""What a Keras 3 model TF-MOT's QAT cannot take gets instead: both take any Keras 3 model."""


def _tf_keras_for_qat(model):
    """`model` in tf_keras for TF-MOT (a Keras 3 one translated by the bridge).

    Raises:
      UnsupportedLayerError: a Keras 3 model of custom layers (KerasHub's) or a subclassed
        one: one line naming its layers, TF-MOT's limit and `QAT_ALTERNATIVES`.
    """
    if is_keras3_object(model):
        bad = untranslatable_parts(model)
        if bad:
            listed = "; ".join(f"{name} ({kind}: {why})" for name, kind, why in bad[:3])
            raise UnsupportedLayerError(
                f"QAT cannot take {getattr(model, 'name', model)!r}: {len(bad)} layer(s) the "
                f"tf_keras bridge cannot translate: {listed}{'; ...' if len(bad) > 3 else ''} "
                f"(TF-MOT's limit: its quantize-aware training wraps standard tf_keras layers "
                f"only); {QAT_ALTERNATIVES}")
    return as_tf_keras(model)


def check_qat_ready(model, only_layers=None, skip_layers=None):
    """Checks, before any training, that `quantize_aware` will accept `model` as asked.

    Returns:
      (flat_model, names of the layers to quantize).

    Raises:
      ConfigError: unknown layer names in `only_layers` / `skip_layers`.
      UnsupportedLayerError: layers the default 8-bit scheme cannot quantize.
      ModelError: a model still wrapped for pruning.
    """
    model = _tf_keras_for_qat(model)
    if pruning_wrappers(model):
        raise ModelError(f"model {model.name!r} still has pruning wrappers: call strip_pruning "
                         "(tfaccel.compress.prune) before QAT")
    model = flatten_model(model)
    names = {layer.name for layer in model.layers}
    for arg, given in (("only_layers", only_layers), ("skip_layers", skip_layers)):
        unknown = sorted(set(given or ()) - names)
        if unknown:
            raise ConfigError(f"{arg} names unknown layers {', '.join(unknown)}: the model's "
                              f"layers are {', '.join(sorted(names))}")
    chosen = {layer.name for layer in model.layers
              if not isinstance(layer, keras.layers.InputLayer)
              and (only_layers is None or layer.name in only_layers)
              and layer.name not in set(skip_layers or ())}
    check_quantizable(model, chosen)
    return model, chosen


def quantize_aware(model, scheme="default", only_layers=None, skip_layers=None):
    """A quantization-aware copy of `model`, ready to compile and fine-tune.

    Example:

        qat = quantize_aware(model, skip_layers=["my_lambda"])

    A Keras 3 model goes through its verified tf_keras translation
    (`tfaccel.keras.bridge`): the QAT model is tf_keras (Keras 3 has no QAT),
    fine-tuned with tf_keras and converted with `convert_to_tflite`:

        qat = quantize_aware(model3)
        training.compile_classifier(qat, training.make_optimizer("adam", 1e-4))
        qat.fit(train_ds, epochs=2)
        convert_to_tflite(qat, "model_int8.tflite", mode="int8")

    Args:
      model: a tf_keras or Keras 3 functional or Sequential model (nested
        models are flattened); for `prune_preserve`, a pruned model after
        `strip_pruning`.
      scheme: one of `SCHEMES`.
      only_layers: names of the layers to quantize (default: all).
      skip_layers: names of layers to leave in float.

    Returns:
      A new tf_keras model (the weights are copied; `model` is unchanged).

    Raises:
      ConfigError: unknown scheme, or unknown layer names.
      UnsupportedLayerError: layers the scheme cannot quantize (all listed).
      ModelError: a pruned model still wrapped for pruning.
    """
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown QAT scheme {scheme!r}: use one of {', '.join(SCHEMES)}")
    model, chosen = check_qat_ready(model, only_layers, skip_layers)
    if is_mixed_precision(model):
        logging.warning("QAT fine-tunes %r in float32, not under the mixed precision policy %r: "
                        "TF-MOT's fake-quant kernels have no float16 version",
                        model.name, keras.mixed_precision.global_policy().name)
    # TF-MOT clones through layer configs; a Lambda left in float (skip_layers) is the
    # caller's own in-memory code, so Keras's safe mode (meant for loading files) may let it be.
    # The float32 policy also covers the layers TF-MOT adds.
    with precision_scope("float32"), _compat.unsafe_deserialization():
        model = apply_precision(model, "float32")
        tfmot_keras = tfmot().quantization.keras
        every_layer = {layer.name for layer in model.layers
                       if not isinstance(layer, keras.layers.InputLayer)}
        no_op = _compat.no_op_quantize_config()
        same_scale = {layer.name for layer in model.layers
                      if layer.name in chosen and type(layer).__name__ in _SAME_SCALE}
        if chosen == every_layer and not same_scale:
            annotated = tfmot_keras.quantize_annotate_model(model)
        else:
            def annotate(layer, new):
                if layer.name not in chosen:
                    return new
                config = no_op() if layer.name in same_scale else None
                return tfmot_keras.quantize_annotate_layer(new, config)

            annotated = clone_with_weights(model, wrap=annotate, nested=False)
        if scheme == "prune_preserve":
            quantize_scheme = tfmot_keras.collab_opts.Default8BitPrunePreserveQuantizeScheme()
        else:
            quantize_scheme = tfmot_keras.default_8bit.Default8BitQuantizeScheme()
        try:
            with tfmot_keras.quantize_scope({"NoOpQuantizeConfig": no_op}):
                return tfmot_keras.quantize_apply(annotated, quantize_scheme)
        except (RuntimeError, ValueError) as e:  # e.g. a custom layer without a QuantizeConfig
            raise UnsupportedLayerError(
                f"TF-MOT cannot quantize {model.name!r}: {first_line(e)}; skip the layer it names "
                "(skip_layers=[...]) or quantize only a subset (only_layers=[...])") from None


def check_quantize_aware(model, scheme="default", only_layers=None, skip_layers=None,
                         prune_configs=()):
    """Builds what `quantize_aware` would build, on a throwaway copy, so that errors come first.

    `check_qat_ready` reads the layers; this also runs TF-MOT's own cloning and
    graph transforms (where, e.g., a custom layer without a QuantizeConfig
    fails), in seconds and before any training. For a model that will be
    pruned first, pass the pruning stages as `prune_configs`: the copy is
    wrapped and stripped the same way (`tfaccel.compress.prune`), so the check sees the
    layers QAT will get after pruning. `model` is not changed.

    Example:

        check_quantize_aware(model, "prune_preserve", prune_configs=[PruneConfig()])

    Raises:
      The errors of `prune.prune_to_sparsity` and `quantize_aware`
      (ConfigError, UnsupportedLayerError, ModelError).
    """
    model = _tf_keras_for_qat(model)  # once, not at each step below
    for config in prune_configs:
        # Only the structure matters here: a one-step ramp that any config can take.
        config = dataclasses.replace(config, initial_sparsity=0.0, begin_epoch=0.0,
                                     end_epoch=None, frequency=None)
        wrapped, _ = prune.prune_to_sparsity(model, 0.5, 1, 2, config)
        model = prune.strip_pruning(wrapped)
    quantize_aware(model, scheme, only_layers, skip_layers)
