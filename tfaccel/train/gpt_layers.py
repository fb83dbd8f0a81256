"""The GPT's layers of its own, and one block's layers and forward pass (`tfaccel.train.gpt`).

`PositionEmbedding` (learned positions, added to the token embeddings) and
`TiedEmbedding` (a token embedding that also computes the logits as `h @ E^T`) are the
only layers a plain GPT needs beyond tf_keras's. `RecomputeBlock` is one Transformer
block whose forward pass runs under `tf.recompute_grad`. All three are registered for
.keras files under the package "tfaccel".

Dropout under recomputation: `tf.recompute_grad` runs the block's forward again in the
backward pass, and a stateful dropout (tf_keras's `Dropout`) draws a new mask when it
runs again, so the gradients would be those of another network than the one whose loss
was computed (tests/test_gpt.py shows it happen). `RecomputeBlock` therefore draws its
dropout seeds once per call, outside the recomputed function, and drops with stateless
ops from them: the recomputation drops the same units. `MultiHeadAttention` draws its
attention-probability mask from its own stateful generator, so the GPT drops the
embeddings and each residual branch (GPT-2's embedding and residual dropout) and not the
attention probabilities.

Under a mixed policy the matrix products (and the attention's scores and softmax) compute
in bfloat16/float16 and the residual stream in float32: its sums (`PositionEmbedding`'s
and every `ResidualAdd`) and the LayerNorms' statistics from it (`Float32LayerNorm`,
whose output is rounded once for the products). The layers keep the model's policy (so
`apply_precision` and `with_recompute` see one policy) and compute in float32 by
themselves. On the trained tiny GPT in bfloat16 the logits are closer to the float32
model's (mean |difference| 0.0093 against tf_keras's layers' 0.0110) and so are the
gradients (1.55% against 1.81%), for a few casts of `[batch, T, d]` tensors and the same
memory kept for the backward pass (the LayerNorms read a float32 copy of their input
before too). Float32 attention scores (tried: 0.0079 and 1.27%) kept float32
probabilities for the backward pass: about a fifth more activation memory per block at
context 32, more at longer contexts (docs/language-models.md).
"""

import math

import tensorflow as tf

from tfaccel.errors import ModelError
from tfaccel.keras import keras

LN_EPSILON = 1e-5
INIT_STDDEV = 0.02  # GPT-2's initialization, at GPT-2's width
INIT_WIDTH = 768
BLOCK_PARTS = ("ln_1", "attn", "attn_drop", "attn_add", "ln_2", "mlp_fc", "mlp_proj",
               "mlp_drop", "mlp_add")  # forward order, which is also the weights' order


def init_stddev(d_model):
    """The weights' initial standard deviation for a model `d_model` wide.

    GPT-2's 0.02 at its width of 768, scaled as ``1 / sqrt(d_model)`` (the fan-in rule)
    for other widths: 0.049 for the tiny model's 128. GPT-2's flat 0.02 at width 128
    trains the tiny model markedly slower (validation loss 1.322 against 1.271 after
    2,000 steps; docs/language-models.md). Residual projections get it divided by
    ``sqrt(2 layers)``, as GPT-2's do.
    """
    return INIT_STDDEV * math.sqrt(INIT_WIDTH / d_model)


def normal(stddev=INIT_STDDEV):
    """A fresh (unshared) normal initializer."""
    return keras.initializers.RandomNormal(stddev=stddev)


def check_context(length, context):
    """Raises ModelError when `length` tokens do not fit a `context`-token model."""
    if length > context:
        raise ModelError(f"sequence length {length} is larger than the model's context "
                         f"{context}: pass --sequence_length<={context} or a model with a "
                         "longer context")


def _float32_inputs(layer_kwargs):
    """A layer's keyword arguments with autocast off: the layer keeps the model's policy
    but is given its float32 inputs as they are (the residual stream's layers)."""
    return dict(layer_kwargs, autocast=False)


@keras.saving.register_keras_serializable(package="tfaccel")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of positions 0..T-1 to `[batch, T, d]` inputs (T <= context)."""

    def __init__(self, context, initializer=None, **kwargs):
        super().__init__(**_float32_inputs(kwargs))
        self.context = int(context)
        self.initializer = keras.initializers.get(initializer or normal())

    def build(self, input_shape):
        self.embeddings = self.add_weight(name="embeddings", shape=(self.context, input_shape[-1]),
                                          initializer=self.initializer)
        super().build(input_shape)

    def call(self, inputs):
        """The float32 sum (the residual stream starts here, float32 under any policy)."""
        if inputs.shape[1] is not None:
            check_context(inputs.shape[1], self.context)
        return tf.cast(inputs, tf.float32) + tf.cast(self.embeddings[:tf.shape(inputs)[1]],
                                                     tf.float32)

    def get_config(self):
        return dict(super().get_config(), context=self.context,
                    initializer=keras.initializers.serialize(self.initializer))


@keras.saving.register_keras_serializable(package="tfaccel")
class TiedEmbedding(keras.layers.Embedding):
    """A token embedding that also makes the logits: `layer(h, reverse=True)` is `h @ E^T`.

    The model calls it twice (on the tokens, and on the last hidden states), so the
    output projection has no weights of its own. It computes in its own dtype (float32
    in `build_gpt`), so the logits are float32 under a mixed policy.
    """

    def call(self, inputs, reverse=False):
        if not reverse:
            return super().call(inputs)
        kernel = tf.cast(self.embeddings, self.compute_dtype)
        return tf.matmul(tf.cast(inputs, self.compute_dtype), kernel, transpose_b=True)


@keras.saving.register_keras_serializable(package="tfaccel")
class ResidualAdd(keras.layers.Add):
    """The residual stream's sum, in float32 under any policy (its inputs are not cast to
    the compute dtype): 16-bit sums would round the stream at every block."""

    def __init__(self, **kwargs):
        super().__init__(**_float32_inputs(kwargs))

    def call(self, inputs):
        return tf.add_n([tf.cast(x, tf.float32) for x in inputs])


@keras.saving.register_keras_serializable(package="tfaccel")
class StreamDropout(keras.layers.Dropout):
    """Dropout of the float32 residual stream (the embeddings'), in float32 under any
    policy: tf_keras's Dropout would cast the stream to the compute dtype."""

    def __init__(self, rate, **kwargs):
        super().__init__(rate, **_float32_inputs(kwargs))


@keras.saving.register_keras_serializable(package="tfaccel")
class Float32LayerNorm(keras.layers.LayerNormalization):
    """LayerNormalization of the float32 residual stream, in float32 under any policy.

    tf_keras's LayerNormalization casts its input to the compute dtype first (16-bit
    under a mixed policy) and only then computes the statistics in float32; this one
    normalizes the float32 input itself and rounds only its output to the compute dtype,
    once, for the matrix products that take it (a float32 output would be cast by each
    of the attention's three projections, and kept three times for the backward pass).
    """

    def __init__(self, **kwargs):
        super().__init__(**_float32_inputs(kwargs))

    def call(self, inputs):
        x = tf.cast(inputs, tf.float32)
        mean, variance = tf.nn.moments(x, self.axis, keepdims=True)
        normalized = tf.nn.batch_normalization(x, mean, variance, offset=self.beta,
                                               scale=self.gamma, variance_epsilon=self.epsilon)
        return tf.cast(normalized, self.compute_dtype)


def block_layers(prefix, d_model, heads, mlp_ratio, dropout, residual_stddev, dtype=None):
    """{part: layer} of one block in forward order, named `<prefix>_<part>` (no dropout at 0)."""
    def kw(part):
        return {"name": f"{prefix}_{part}", **({} if dtype is None else {"dtype": dtype})}

    std = init_stddev(d_model)

    layers = {
        "ln_1": Float32LayerNorm(epsilon=LN_EPSILON, **kw("ln_1")),
        "attn": keras.layers.MultiHeadAttention(heads, d_model // heads,
                                                kernel_initializer=normal(std), **kw("attn")),
        "attn_add": ResidualAdd(**kw("attn_add")),
        "ln_2": Float32LayerNorm(epsilon=LN_EPSILON, **kw("ln_2")),
        "mlp_fc": keras.layers.Dense(mlp_ratio * d_model, activation="gelu",
                                     kernel_initializer=normal(std), **kw("mlp_fc")),
        "mlp_proj": keras.layers.Dense(d_model, kernel_initializer=normal(residual_stddev),
                                       **kw("mlp_proj")),
        "mlp_add": ResidualAdd(**kw("mlp_add")),
    }
    if dropout:
        layers["attn_drop"] = keras.layers.Dropout(dropout, **kw("attn_drop"))
        layers["mlp_drop"] = keras.layers.Dropout(dropout, **kw("mlp_drop"))
    return {part: layers[part] for part in BLOCK_PARTS if part in layers}


def block_forward(layers, x, dropout=None):
    """One pre-LayerNorm block of `layers` on `x`; `dropout(part, tensor)` drops a branch
    (default: the block's Dropout layers, as the plain model does)."""
    if dropout is None:
        def dropout(part, t):
            return layers[part](t) if part in layers else t

    h = layers["ln_1"](x)
    x = layers["attn_add"]([x, dropout("attn_drop", layers["attn"](h, h, use_causal_mask=True))])
    h = layers["mlp_proj"](layers["mlp_fc"](layers["ln_2"](x)))
    return layers["mlp_add"]([x, dropout("mlp_drop", h)])


def _no_dropout(part, x):
    return x


def dropout_seeds():
    """Two stateless-dropout seeds `[2, 2]` int64, fresh on every call (a stateful draw)."""
    return tf.random.uniform((2, 2), maxval=tf.int64.max, dtype=tf.int64)


@keras.saving.register_keras_serializable(package="tfaccel")
class RecomputeBlock(keras.layers.Layer):
    """A GPT block whose internals are recomputed in the backward pass (`tf.recompute_grad`).

    It holds the same layers as the plain model's block `<name>` (`<name>_ln_1`,
    `<name>_attn`, ...: same names, same weights in the same order) and keeps only its
    input for the backward pass. In training its dropout masks come from seeds drawn
    once per call, outside the recomputed function, through stateless ops, so the
    recomputation drops the same units as the forward pass did.
    """

    def __init__(self, d_model, heads, mlp_ratio=4, dropout=0.0, residual_stddev=INIT_STDDEV,
                 **kwargs):
        super().__init__(**_float32_inputs(kwargs))  # the stream stays float32
        self.d_model, self.heads, self.mlp_ratio = int(d_model), int(heads), int(mlp_ratio)
        self.dropout, self.residual_stddev = float(dropout), float(residual_stddev)
        layers = block_layers(self.name, self.d_model, self.heads, self.mlp_ratio, self.dropout,
                              self.residual_stddev, dtype=self.dtype_policy)
        self._parts = tuple(layers)
        for part, layer in layers.items():  # tracked in forward order: the weights' order
            setattr(self, part, layer)

    @property
    def block_layers(self):
        """{part: layer} in forward order ('ln_1', 'attn', ..., 'mlp_add')."""
        return {part: getattr(self, part) for part in self._parts}

    def build(self, input_shape):
        # The variables are made here, once, outside tf.recompute_grad (which must not make
        # any), by a plain forward pass on one token; the absolute name scope ("") gives them
        # the plain model's names ("block_0_ln_1/gamma:0").
        with tf.name_scope(""):
            block_forward(self.block_layers, tf.zeros((1, 1, self.d_model), self.compute_dtype),
                          _no_dropout)
        super().build(input_shape)

    def call(self, inputs, training=None):
        layers, drop = self.block_layers, _no_dropout
        if self.dropout and training is not None and training is not False:
            # Drawn outside the recomputed function, so that the recomputation reuses them.
            seeds = dropout_seeds()

            def drop(part, x):
                dropped = tf.nn.experimental.stateless_dropout(
                    x, self.dropout, seed=seeds[0 if part == "attn_drop" else 1])
                return dropped if training is True else tf.where(tf.cast(training, tf.bool),
                                                                  dropped, x)

        def forward(x):
            return block_forward(layers, x, drop)

        return tf.recompute_grad(forward)(inputs)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return dict(super().get_config(), d_model=self.d_model, heads=self.heads,
                    mlp_ratio=self.mlp_ratio, dropout=self.dropout,
                    residual_stddev=self.residual_stddev)
