"""What a model needs in memory to train: parameters, and bytes kept per example.

A `MemoryProfile` is the model-dependent half of a memory plan
(`tfaccel.performance.plan`): the parameters, and which activations one training
example leaves alive for the backward pass, layer by layer. It comes from a built
model of either Keras (`profile_keras_model`, from its layers' output shapes), a
zoo name (`profile_zoo_model`), or a decoder-only Transformer's size
(`profile_transformer`, formulas only, for sizes far too large to build).

What a Keras layer keeps (`layer_activation_bytes`), as measured on TensorFlow
2.21's CPU kernels with `tf.config.experimental.get_memory_info` (see
docs/memory.md for the measurements):

- every layer's output, in the layer's compute dtype (the next layer's gradient
  needs it), except reshapes (`Flatten`, `Reshape`: views of their input);
- `Dropout` also its mask, as large as its output (TensorFlow multiplies by a
  float mask of the input's dtype);
- a convolution with a fused non-linear activation also its pre-activation;
- the model's input, in float32 (and its cast to the compute dtype under mixed
  precision).

The Transformer formulas follow Korthikanti et al.'s accounting, "Reducing
Activation Recomputation in Large Transformer Models" (2022), section 4.1 (``34 h +
5 a s`` bytes per layer and token with 16-bit activations), recounted for what the
backward ops of a tf_keras block read, listed from TensorFlow 2.21's gradient graph.

Example:

    from tfaccel.performance import memory_profile

    profile = memory_profile.profile_transformer(layers=40, d_model=5120, heads=40,
                                                 vocab_size=32000, sequence_length=2048)
    print(profile.parameters / 1e9)   # ~12.9 (billion)
"""

import dataclasses
import math

from tfaccel import choices
from tfaccel.choices import MODELS
from tfaccel.errors import ConfigError, ModelError

_HALF = ("float16", "bfloat16")
GPT_SIZES = {name: (size["layers"], size["heads"], size["d_model"], size["context"])
             for name, size in choices.GPT_SIZES.items()}
"""Named decoder sizes (`tfaccel.choices.GPT_SIZES`) as (layers, heads, d_model, context),
for `profile_transformer` and `tfaccel plan --model=gpt --gpt_size=`."""
_VIEWS = ("Flatten", "Reshape", "InputLayer")


@dataclasses.dataclass(frozen=True)
class LayerMemory:
    """One layer (or Transformer block): its parameters and what one example keeps."""

    name: str
    parameters: int
    activation_bytes: int  # kept for the backward pass, per example
    output_bytes: int  # its output alone, per example (the backward's transient size)
    recompute_boundary_bytes: int = 0  # kept per example under recomputation (the input)
    is_input: bool = False  # the model's input (or its cast): on the first stage, no stage's own


@dataclasses.dataclass(frozen=True)
class MemoryProfile:
    """The model-dependent half of a memory plan.

    Attributes:
      name: the model's name.
      layers: `LayerMemory` per layer (or block), in order.
      trainable: trainable parameters; `non_trainable`: the others (BatchNorm statistics).
      input_bytes: one example's input, as fed (float32 images, int32 tokens).
      half_activations: whether `activation_bytes` were computed for 16-bit activations.
      recompute_unit: what recomputation recomputes ('block' for Transformers, 'layer').
      fixed_activation_bytes: activations kept whatever the batch (a traced step's fit).
      pool_slack_per_example: per example, what TensorFlow's pooled allocator holds beyond
        the bytes asked for (`memory_graph.pool_slack`: chunks served whole).
      kernel_workspace_bytes: what the CPU kernels' own workspaces add to the peak at the
        planned batch (`host_kernels.kernel_buffers`, with oneDNN off: convolution
        gradients' column buffers, a bfloat16 product's float32 copies, batch-norm and
        max-pooling gradients' buffers).
      recomputed_step_peak_bytes: for a traced step that recomputes blocks
        (`tf.recompute_grad`), the replay's peak of activation buffers at the planned batch
        without the kernels' own buffers (`memory_graph.PoolReplay.recomputed_peak`); 0
        otherwise.
      method: where the activations came from: the model's layers, a closed form, or the
        graph of the traced training step (`tfaccel.performance.memory_graph`).
      update_optimizer: the optimizer whose update was traced (`memory_graph.optimizer_update`)
        for the two fields after it; "" when none was (the plan counts slots by its rule).
      optimizer_slot_bytes: that optimizer's variables; update_bytes: what its update adds
        beyond the gradients (`memory_graph.optimizer_update`); early_update_bytes: what it
        makes before any gradient exists, alive beside the activations.
    """

    name: str
    layers: tuple
    trainable: int
    non_trainable: int
    input_bytes: int
    half_activations: bool = False
    recompute_unit: str = "layer"
    fixed_activation_bytes: int = 0
    pool_slack_per_example: float = 0.0
    kernel_workspace_bytes: int = 0
    recomputed_step_peak_bytes: int = 0
    method: str = "layers (each layer's output shapes)"
    update_optimizer: str = ""
    optimizer_slot_bytes: int = 0
    update_bytes: int = 0
    early_update_bytes: int = 0

    @property
    def parameters(self):
        return self.trainable + self.non_trainable

    def activation_bytes(self, recompute=False):
        """Bytes one example keeps for the backward pass (with recomputation: the unit
        inputs, plus the largest unit's full activations while it is recomputed)."""
        if not recompute:
            return sum(layer.activation_bytes for layer in self.layers)
        kept = sum(layer.recompute_boundary_bytes or layer.output_bytes for layer in self.layers)
        return kept + max((layer.activation_bytes for layer in self.layers), default=0)


def _elements(shape):
    dims = [d for d in tuple(shape)[1:]]
    if any(d is None for d in dims):
        raise ModelError(f"a layer output has an unknown dimension ({tuple(shape)}): build the "
                         "model with a fixed input shape to plan its memory")
    return int(math.prod(dims))


def _outputs(layer):
    out = layer.output
    return out if isinstance(out, (list, tuple)) else [out]


_NEEDS_INPUT = ("Dense", "Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D", "SeparableConv2D",
                "Conv2DTranspose", "BatchNormalization", "LayerNormalization", "MaxPooling1D",
                "MaxPooling2D", "MaxPooling3D", "Multiply", "Resizing", "MultiHeadAttention",
                "EinsumDense", "GlobalMaxPooling2D", "UnitNormalization")
"""Layers whose gradient reads their input: the layer before them keeps its output."""
_NEEDS_OUTPUT = ("ReLU", "Softmax", "MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "ELU")
"""Layers whose gradient reads their own output (ReLU's, softmax's, max pooling's)."""
_OUTPUT_ACTIVATIONS = ("relu", "softmax", "sigmoid", "tanh", "elu", "relu6")


def _activation_name(layer):
    from tfaccel.keras import keras  # deferred: tf_keras (tfaccel.keras loads it)

    activation = getattr(layer, "activation", None)
    if activation is None:
        return None
    name = keras.activations.serialize(activation)
    return name if isinstance(name, str) else None


def _calls(config):
    """{layer name: how many times the model (its `get_config()`) calls it} (a shared layer
    keeps one set of activations per call)."""
    return {c.get("name") or c["config"]["name"]: max(1, len(c.get("inbound_nodes") or [1]))
            for c in config["layers"]}


def _consumers(config):
    """{layer name: [names of the layers that take its output]}, from the model's config."""
    names = [c.get("name") or c["config"]["name"] for c in config["layers"]]
    out = {name: [] for name in names}
    if not all("inbound_nodes" in c for c in config["layers"]):  # Sequential: a chain
        for a, b in zip(names, names[1:]):
            out[a].append(b)
        return out
    for c in config["layers"]:
        for node in c["inbound_nodes"]:
            for inbound in (node if isinstance(node, list) else node.get("args", [])):
                if isinstance(inbound, list) and inbound and isinstance(inbound[0], str):
                    out.setdefault(inbound[0], []).append(c.get("name") or c["config"]["name"])
    return out


def _reads_its_input(layer, producer):
    """A plain ReLU layer after anything but BatchNormalization keeps its input too (measured:
    TensorFlow fuses BatchNormalization + ReLU, and its CPU ReLU gradient otherwise reads the
    input)."""
    return (type(layer).__name__ == "ReLU" and getattr(layer, "max_value", None) is None
            and producer is not None and type(producer).__name__ != "BatchNormalization")


def layer_activation_bytes(layer, compute_half, consumers=()):
    """(kept bytes, output bytes) of one example for a built tf_keras layer; see the module.

    Args:
      layer: a built layer.
      compute_half: whether the model computes in 16 bits (its layers' compute dtype).
      consumers: the layers that take this layer's output (None: unknown, assume kept).
    """
    kind = type(layer).__name__
    size = 2 if (compute_half and layer.compute_dtype in _HALF) else 4
    out = sum(_elements(t.shape) for t in _outputs(layer)) * size
    if kind in _VIEWS:
        return 0, out
    activation = _activation_name(layer)
    own = kind in _NEEDS_OUTPUT or (kind == "Activation" and activation in _OUTPUT_ACTIVATIONS) \
        or (activation in _OUTPUT_ACTIVATIONS and kind not in ("Activation",))
    read = consumers is None or any(
        type(c).__name__ in _NEEDS_INPUT or type(c).__name__ in ("Functional", "Sequential",
                                                                    "Model")
        or _reads_its_input(c, layer) for c in consumers)
    kept = out if (own or read) else 0
    if kind == "Dropout":
        kept += out  # its mask, in the activations' dtype
    if kind.startswith(("Conv", "DepthwiseConv", "SeparableConv")) and activation not in (
            None, "linear"):
        kept += out  # the pre-activation, which TensorFlow's CPU kernels keep for a conv
    return kept, out


def _through_views(name, consumers, layers_by_name):
    """The layers that read `name`'s output, looking through reshapes (views of it)."""
    out = []
    for c in consumers.get(name, []):
        layer = layers_by_name.get(c)
        if layer is not None and type(layer).__name__ in ("Flatten", "Reshape"):
            out += _through_views(c, consumers, layers_by_name)
        elif layer is not None:
            out.append(layer)
    return out


def profile_keras_model(model):
    """A `MemoryProfile` of a built tf_keras model, from its layers' output shapes.

    A layer's output counts when a later layer's gradient reads it (`_NEEDS_INPUT`,
    looking through reshapes) or its own gradient does (`_NEEDS_OUTPUT`, and fused
    activations such as ReLU). Nested models count their layers' outputs as kept.
    Nothing is run beyond the model; a Keras 3 model is walked as its verified translation.

    Raises:
      ModelError: the model is not built, is subclassed (no layer graph to walk), or has
        an output of unknown size.
    """
    # deferred: tf_keras (tfaccel.keras loads it)
    from tfaccel.keras import bridge, is_keras3_object, keras

    model = bridge.as_tf_keras(model) if is_keras3_object(model) else model

    if not getattr(model, "built", False) or not isinstance(model, keras.Model) or \
            type(model).__name__ not in ("Functional", "Sequential", "Model"):
        raise ModelError(f"cannot walk {type(model).__name__}: plan a built Sequential or "
                         "functional model (a subclassed model has no layer graph)")
    try:
        inputs = model.inputs
    except AttributeError:
        inputs = None
    if not inputs:
        raise ModelError("the model has no inputs yet: build it with a fixed input shape")
    half = any(layer.compute_dtype in _HALF for layer in model.layers)
    layers = []

    def walk(m):
        config = m.get_config()
        consumers, calls = _consumers(config), _calls(config)
        by_name = {layer.name: layer for layer in m.layers}
        for layer in m.layers:
            if isinstance(layer, keras.Model):
                walk(layer)
                continue
            if type(layer).__name__ == "InputLayer" and m is not model:
                continue
            readers = _through_views(layer.name, consumers, by_name)
            if not consumers.get(layer.name) and m is not model:
                readers = None  # a nested model's output: its reader is outside
            kept, out = layer_activation_bytes(layer, half, readers)
            n = calls.get(layer.name, 1)
            layers.append(LayerMemory(layer.name, layer.count_params(), n * kept, out,
                                      is_input=type(layer).__name__ == "InputLayer"))

    walk(model)
    input_bytes = sum(_elements(t.shape) * 4 for t in inputs)
    if half:  # the first layer's cast of the input
        layers.insert(0, LayerMemory("input cast", 0, input_bytes // 2, input_bytes // 2,
                                     is_input=True))
    trainable = sum(int(math.prod(w.shape)) for w in model.trainable_weights)
    non_trainable = sum(int(math.prod(w.shape)) for w in model.non_trainable_weights)
    return MemoryProfile(model.name, tuple(layers), trainable, non_trainable, input_bytes, half)


def profile_zoo_model(name, input_shape, num_classes, precision="float32"):
    """Builds zoo model `name` under `precision` and profiles it (`profile_keras_model`)."""
    from tfaccel.train import models, precision as precisions  # deferred: TensorFlow

    with precisions.precision_scope(precision):
        model = models.build_model(name, tuple(input_shape), num_classes)
    return profile_keras_model(model)


def built_model(model, input_shape=None, num_classes=None, precision="float32"):
    """`model` built: a model as it is, a zoo name (with `input_shape` and `num_classes`) or
    a .keras/.h5 file, built under `precision`.

    Raises:
      ModelError: a zoo name without its input shape.
    """
    if not isinstance(model, str):
        return model
    from tfaccel.train import models, precision as precisions  # deferred: TensorFlow

    if model in MODELS:
        if input_shape is None or num_classes is None:
            raise ModelError(f"zoo model {model!r}: give input_shape and num_classes")
        with precisions.precision_scope(precision):
            return models.build_model(model, tuple(input_shape), num_classes)
    with precisions.precision_scope(precision):
        loaded = models.load_model_file(model)
        if precision != "float32":
            loaded = precisions.apply_precision(loaded, precision)
    return loaded


def profile_of(model, input_shape=None, num_classes=None, precision="float32"):
    """A `MemoryProfile` of `model` from its layers: a profile already, a built tf_keras
    model, a zoo name (with `input_shape` and `num_classes`) or a .keras/.h5 file (built
    under `precision`).

    Raises:
      ModelError: a zoo name without its input shape, or a model that cannot be profiled.
    """
    if isinstance(model, MemoryProfile):
        return model
    return profile_keras_model(built_model(model, input_shape, num_classes, precision))


def transformer_parameters(layers, d_model, vocab_size, sequence_length, tied=True):
    """Parameters of a GPT-2-style decoder: 12 h^2 + 13 h per block (attention 4h^2 + 4h,
    MLP 8h^2 + 5h, two LayerNorms 4h), token and position embeddings, a final LayerNorm, and
    an output projection unless tied to the token embedding."""
    h = d_model
    per_block = 12 * h * h + 13 * h
    embeddings = vocab_size * h + sequence_length * h
    head = 0 if tied else vocab_size * h  # no bias, as GPT-2's (and tfaccel's) output layer
    return per_block, layers * per_block + embeddings + 2 * h + head


def profile_transformer(layers, d_model, heads, vocab_size, sequence_length, tied=True,
                        half=True, dropout=0.0, context=None, name="gpt", encoder=False,
                        num_classes=2):
    """A `MemoryProfile` of a decoder-only Transformer from its size (nothing is built).

    Per example (one sequence of s = `sequence_length` tokens; `context`, default s, is
    the position embedding's rows) a block keeps what its backward ops read, as TF
    2.21's gradient graph of a `tfaccel.train.gpt` block lists them (h = d_model): the
    scaled query, key, value and attention output (4 s h values), the softmax (a s^2),
    the LayerNorms' normalized inputs and outputs (4 s h), the residual stream (2 s h),
    the GELU's three intermediates and output (16 s h): ``4 s (26 h + a s)`` bytes in
    float32; in 16-bit (`half`) 2 bytes each but the LayerNorms' float32 copies of
    their inputs (replacing the residual stream): ``s (60 h + 2 a s)`` bytes. Dropout
    adds two 1-byte masks (``2 s h``; Korthikanti et al. count ``34 h + 5 a s`` bytes
    per token for Megatron). Recomputed, a block keeps its input (``s h`` values, in
    float32 in 16-bit too: the GPT's residual stream, measured 226 -> 256-273 MB for the
    recomputing tiny GPT at batch 256 when it became float32, `bench_memory.py`). A
    block's backward transient is the gradient of its largest tensor (``max(a s^2, 4 s
    h)``). After the blocks: the loss's float32 gradient of the logits (``s V``) and the
    final LayerNorm's tensors (``8 s h`` bytes: the GPT's residual stream is float32 in
    16-bit too, so the LayerNorms read it without a copy; a LayerNorm's input is counted
    with the block or the embeddings that make it, the first one's, ``4 s h``, with the
    embeddings).

    An `encoder` (BERT-style: attention over the whole sequence, which keeps the same
    tensors) has no language-model head: the first token is pooled (a ``h x h`` Dense)
    into a classifier of `num_classes`, so no ``s V`` logits are kept, only the final
    LayerNorm's tensors and the pooled vectors.

    Raises:
      ConfigError: a size that is not positive, or `d_model` not divisible by `heads`.
    """
    for label, value in (("layers", layers), ("d_model", d_model), ("heads", heads),
                         ("vocab_size", vocab_size), ("sequence_length", sequence_length)):
        if int(value) <= 0:
            raise ConfigError(f"{label}={value}: a Transformer size must be a positive integer")
    if d_model % heads:
        raise ConfigError(f"d_model={d_model} is not divisible by heads={heads}: pick a d_model "
                          "that is a multiple of the heads")
    s, h, a, v = sequence_length, d_model, heads, vocab_size
    width = 2 if half else 4  # bytes of an activation
    per_block, total = transformer_parameters(layers, d_model, vocab_size,
                                              context or sequence_length, tied)
    block_bytes = s * (60 * h + 2 * a * s) if half else 4 * s * (26 * h + a * s)
    block_bytes += 2 * s * h if dropout else 0
    boundary = 4 * s * h  # the residual stream: float32 under a mixed policy too
    largest = width * max(a * s * s, 4 * s * h)
    blocks = [LayerMemory(f"block_{i}", per_block, block_bytes, largest, boundary)
              for i in range(layers)]
    embed = LayerMemory("embeddings", vocab_size * h + (context or s) * h, 4 * s * h, boundary,
                        boundary)
    head = 2 * h + (0 if tied else v * h)  # the final LayerNorm, the output projection
    # the loss's float32 gradient of the logits; the final LayerNorm's tensors (its
    # normalized input and output, in 16-bit the logits layer's float32 cast of it)
    head_bytes = 4 * s * v + 8 * s * h
    logits = LayerMemory("logits", head, head_bytes, 4 * s * v, 4 * s * v)
    method = "closed form (Transformer formulas, nothing built)"
    if encoder:
        c = int(num_classes)
        head = 2 * h + h * h + h + h * c + c  # final LayerNorm, pooler, classifier
        total += head - (2 * h + (0 if tied else v * h))
        head_bytes = (12 if half else 8) * s * h + 3 * 4 * h + 4 * c
        logits = LayerMemory("classifier", head, head_bytes, width * s * h, width * s * h)
        method = "closed form (Transformer encoder formulas, nothing built)"
    return MemoryProfile(name, (embed, *blocks, logits), total, 0, 4 * s, half, "block",
                         method=method)
