"""Model configs translated between Keras 3 and tf_keras, layer by layer, refusing what differs.

The two Kerases serialize the standard layers almost alike. What differs is
written down here, per direction: the options only one of them has (dropped
when they hold the value that means "unused", refused at any other value),
options renamed (`LeakyReLU`'s `negative_slope` is tf_keras's `alpha`), the
input layer's shape key, dtype policies (Keras 3 writes an object, tf_keras
takes the policy's name) and the functional graph's links (Keras 3 writes
each layer call as `{"args", "kwargs"}` with tensors in it, tf_keras as
`[[layer, node, tensor, kwargs], ...]`; Keras 3 reads both). Whatever a config
holds that is not in these tables goes through as it is, and the target
Keras's own constructor checks it: `tfaccel.keras.bridge` then compares the
two models' outputs, so nothing that differs gets through silently.

Example:

    from tfaccel.keras import translate

    config = translate.model_config(model3.get_config(), translate.TO_TF_KERAS)
    model2 = keras.Model.from_config(config)      # tf_keras, weights still to copy
"""

import dataclasses


class Untranslatable(ValueError):
    """A layer's config holds something the target Keras cannot express (the message says what)."""


def _one_axis(axis):
    """tf_keras's BatchNormalization writes its axis as a list once built; Keras 3 takes one int."""
    if isinstance(axis, (list, tuple)):
        if len(axis) != 1:
            raise Untranslatable(f"axis={list(axis)}: Keras 3 normalizes along one axis only")
        return axis[0]
    return axis


@dataclasses.dataclass(frozen=True)
class Direction:
    """One way across: the name of the Keras it goes to and what changes on the way.

    Attributes:
      target: 'tf_keras' or 'Keras 3', for messages.
      only_source: {option or (class name, option): its unused value}: options
        the target lacks.
      ignored: (class name or '*', option) pairs the source writes but does not use:
        dropped whatever their value.
      renamed: {(class name, option): the target's name for it}.
      values: {(class name, option): a function turning the value into the target's}.
      legacy_nodes: write graph links in tf_keras's list form.
      keep_module: keep each layer's "module" key (Keras 3 finds classes by it;
        tf_keras would import a Keras 3 module named there).
    """

    target: str
    only_source: dict
    ignored: tuple
    renamed: dict
    values: dict
    legacy_nodes: bool
    keep_module: bool


_SPATIAL_DROPOUTS = ("SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D")
_GROUPLESS = ("DepthwiseConv1D", "DepthwiseConv2D", "Conv1DTranspose", "Conv2DTranspose",
              "Conv3DTranspose", "SeparableConv1D", "SeparableConv2D")

TO_TF_KERAS = Direction(
    target="tf_keras",
    only_source={
        "input_axes": None, "output_axes": None, "quantization_config": None,
        "lora_rank": None, "lora_alpha": None, "rms_scaling": False, "use_cudnn": "auto",
        "flash_attention": None, "sliding_window": None, "use_gate": False,
        ("Resizing", "data_format"): "channels_last", ("Resizing", "pad_to_aspect_ratio"): False,
        ("Resizing", "fill_mode"): "constant", ("Resizing", "fill_value"): 0.0,
        ("Resizing", "antialias"): False},
    ignored=(),
    renamed={("InputLayer", "batch_shape"): "batch_input_shape",
             ("LeakyReLU", "negative_slope"): "alpha"},
    values={},
    legacy_nodes=True, keep_module=False)

TO_KERAS3 = Direction(
    target="Keras 3",
    only_source={
        "input_length": None, "time_major": False, "softmax_robust_masking": False,
        ("Embedding", "sparse"): False, ("Embedding", "activity_regularizer"): None,
        **{(kind, "groups"): 1 for kind in _GROUPLESS},
        **{(kind, key): value for kind in _SPATIAL_DROPOUTS
           for key, value in (("trainable", True), ("noise_shape", None))}},
    # tf_keras writes a layer's input shape into its config, and its separable convolutions'
    # unused `kernel_*` options; the model's InputLayer carries the shape across.
    ignored=(("*", "batch_input_shape"),
             *((kind, f"kernel_{what}") for kind in ("SeparableConv1D", "SeparableConv2D")
               for what in ("initializer", "regularizer", "constraint"))),
    renamed={("InputLayer", "batch_input_shape"): "batch_shape",
             ("LeakyReLU", "alpha"): "negative_slope"},
    values={("BatchNormalization", "axis"): _one_axis},
    legacy_nodes=False, keep_module=True)

MODEL_CLASSES = ("Functional", "Sequential", "Model")
"""Class names a config uses for a (nested) model."""

_POLICIES = ("DTypePolicy", "FloatDTypePolicy", "Policy")


def dtype_name(value):
    """The policy name ('float32', 'mixed_bfloat16') of a dtype config in either Keras's form."""
    if not isinstance(value, dict):
        return value
    if value.get("class_name") not in _POLICIES:
        raise Untranslatable(f"dtype policy {value.get('class_name')} (e.g. a quantized layer) "
                             "has no equivalent: bridge the float model, then quantize")
    return value["config"]["name"]


def _objects(value, direction):
    """`value` with every serialized object in it (initializers, regularizers...) translated."""
    if isinstance(value, list):
        return [_objects(v, direction) for v in value]
    if not isinstance(value, dict):
        return value
    if value.get("class_name") in _POLICIES:
        return dtype_name(value)
    if "class_name" in value and isinstance(value.get("config"), dict):
        out = dict(value)
        out["config"] = _options(value["class_name"], value["config"], direction)
        return out
    return {k: _objects(v, direction) for k, v in value.items()}


def _options(class_name, config, direction):
    out = {}
    for key, value in config.items():
        renamed = direction.renamed.get((class_name, key))
        only = next((k for k in ((class_name, key), key) if k in direction.only_source), None)
        if key == "dtype":
            out[key] = dtype_name(value)
        elif (class_name, key) in direction.values:
            out[key] = direction.values[(class_name, key)](value)
        elif renamed:
            out[renamed] = value
        elif (class_name, key) in direction.ignored or ("*", key) in direction.ignored:
            continue
        elif only is not None:
            if value != direction.only_source[only]:
                raise Untranslatable(f"option {key}={value!r} has no {direction.target} "
                                     "equivalent")
        else:
            out[key] = _objects(value, direction)
    return out


def layer_config(class_name, config, direction):
    """The config of one (non-model) layer as the target Keras writes it.

    Raises:
      Untranslatable: the config uses an option the target Keras lacks.
    """
    return _options(class_name, config, direction)


def _keras3_tensor(value):
    return isinstance(value, dict) and value.get("class_name") == "__keras_tensor__"


def _legacy_node(node):
    """A Keras 3 layer call `{"args", "kwargs"}` as tf_keras's `[[layer, node, tensor, kwargs]]`."""
    args, kwargs = node.get("args", []), node.get("kwargs", {})
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    if any(_keras3_tensor(v) or isinstance(v, (list, dict)) for v in kwargs.values()):
        raise Untranslatable(f"it is called with tensor keyword arguments ({', '.join(kwargs)})")
    if len(args) != 1:
        raise Untranslatable(f"it is called with {len(args)} positional arguments, not one")
    tensors = args[0] if isinstance(args[0], list) else [args[0]]
    if not tensors or not all(_keras3_tensor(t) for t in tensors):
        raise Untranslatable("it is called on something other than tensors (a constant?)")
    return [[*t["config"]["keras_history"], kwargs] for t in tensors]


def _nodes(entry, direction):
    nodes = entry.get("inbound_nodes", [])
    if not direction.legacy_nodes:
        for node in nodes:
            for link in node if isinstance(node, list) else []:
                extra = link[3] if len(link) > 3 else {}
                if any(isinstance(v, (list, dict)) for v in extra.values()):
                    raise Untranslatable("it is called with tensor keyword arguments "
                                         f"({', '.join(extra)})")
        return nodes
    return [node if isinstance(node, list) else _legacy_node(node) for node in nodes]


def layer_entry(entry, direction):
    """One entry of a model config's "layers" (a layer, or a nested model) for the target Keras.

    Raises:
      Untranslatable: see `layer_config`; also a layer call the target cannot express.
    """
    class_name = entry["class_name"]
    if class_name in MODEL_CLASSES:
        config = model_config(entry["config"], direction)
    else:
        config = layer_config(class_name, entry["config"], direction)
    out = {"class_name": class_name, "config": config}
    for key in ("module", "registered_name", "build_config"):
        if key in entry and (direction.keep_module or key == "build_config"):
            out[key] = entry[key]
    if class_name in MODEL_CLASSES and direction.keep_module:
        # tf_keras names its own module for a nested model; Keras 3 rebuilds one through
        # its public classes (keras.Model reads a functional config).
        out.update(module="keras", registered_name=None,
                   class_name="Sequential" if class_name == "Sequential" else "Model")
    if "name" in entry:
        out["name"] = entry["name"]
    if "inbound_nodes" in entry:
        out["inbound_nodes"] = _nodes(entry, direction)
    return out


def _renumber_nested_calls(config, direction):
    """Shifts the links to nested models' calls: tf_keras counts a nested model's own
    (internal) call as its node 0, so its first call in the outer model is node 1 there
    and node 0 in Keras 3."""
    nested = {entry["name"] for entry in config["layers"]
              if entry["class_name"] in MODEL_CLASSES and "name" in entry}
    if not nested:
        return
    shift = 1 if direction.legacy_nodes else -1

    def relink(link):
        if isinstance(link, list) and len(link) >= 3 and link[0] in nested \
                and isinstance(link[1], int):
            return [link[0], max(link[1] + shift, 0), *link[2:]]
        if isinstance(link, list):
            return [relink(item) for item in link]
        return link

    for entry in config["layers"]:
        if "inbound_nodes" in entry:
            entry["inbound_nodes"] = relink(entry["inbound_nodes"])
    for key in ("input_layers", "output_layers"):
        if key in config:
            config[key] = relink(config[key])


def model_config(config, direction):
    """A Sequential or functional model config, every layer in it translated.

    Raises:
      Untranslatable: the first layer that cannot be translated (the bridge
        checks every layer beforehand to list them all).
    """
    out = {k: v for k, v in config.items() if k not in ("layers", "dtype")}
    out["layers"] = [layer_entry(entry, direction) for entry in config["layers"]]
    _renumber_nested_calls(out, direction)
    for key in ("input_layers", "output_layers"):
        # tf_keras writes one input as [[name, 0, 0]] and unnests it when reading; Keras 3
        # would keep the list (a model taking and returning lists of one tensor).
        ends = out.get(key)
        if not direction.legacy_nodes and isinstance(ends, list) and len(ends) == 1 \
                and isinstance(ends[0], list):
            out[key] = ends[0]
    return out


_REDUCED_PRECISION = ("float16", "bfloat16")


def in_float64(config):
    """`config` (a layer's or a model's, of either Keras) with every float32 dtype float64.

    The bridge rebuilds a model and its translation this way when their float32
    outputs disagree: a deep net can amplify float32 rounding (the order of a
    sum) into a different prediction, while float64 rounding stays far below
    any translation error.

    Raises:
      Untranslatable: a layer computes in float16/bfloat16 (its rounding is the model's).
    """
    if isinstance(config, list):
        return [in_float64(item) for item in config]
    if not isinstance(config, dict):
        return config
    out = {}
    for key, value in config.items():
        name = dtype_name(value) if key == "dtype" and isinstance(value, dict) \
            and value.get("class_name") in _POLICIES else value
        if key == "dtype" and isinstance(name, str) and name.endswith(_REDUCED_PRECISION):
            raise Untranslatable(f"dtype {name}: the model computes in reduced precision")
        if key == "dtype" and name == "float32":
            out[key] = _with_name(value, "float64") if isinstance(value, dict) else "float64"
        else:
            out[key] = in_float64(value)
    return out


def _with_name(policy, name):
    return {**policy, "config": {**policy["config"], "name": name}}
