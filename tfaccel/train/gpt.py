"""A decoder-only Transformer language model (GPT), optionally recomputing its blocks' activations.

`build_gpt(config)` is a flat functional tf_keras model from token ids `[batch, T]`
(int32, any T up to the context) to float32 logits `[batch, T, vocab]`: token and
learned position embeddings, `layers` pre-LayerNorm blocks (LayerNorm, causal
`MultiHeadAttention`, residual add; LayerNorm, `Dense(4 d, gelu)`, `Dense(d)`, residual
add), a final LayerNorm and the logits. Everything but the position embedding (and, with
`tie_embeddings`, the token embedding that also computes the logits as `h @ E^T`) is a
standard tf_keras layer or a subclass of one (`gpt_layers`: the LayerNorms and the
residual adds compute in float32 where a mixed policy would round), so precision
policies, pruning and quantization apply to it. The
layer that makes the logits is float32, so under a mixed policy the blocks' matrix
products compute in bfloat16/float16 while the logits and the softmax of the loss stay
float32, and so do the residual stream and the LayerNorms (`gpt_layers`: layers that
keep the model's policy and compute in float32).

With `recompute=True` each block is one `RecomputeBlock` layer holding the same sublayers
(same names, same weight order) whose forward runs under `tf.recompute_grad`: the backward
pass recomputes a block's internals from its input instead of keeping them, so activation
memory holds every block's input plus one block's internals instead of all of them
(benchmarks/bench_recompute.py: 8 layers x d_model 128, context 256, batch 32, trained with
`fit` in float32, peaked at 295 MB instead of 1,260 MB, 0.23x; in eager code, in a
tf.function, with XLA and with bfloat16 alike). Dropout stays correct under recomputation: a
block draws its dropout seeds once per forward pass, outside the recomputed function, and
drops with stateless random ops from them, so the recomputation drops the same units (a
stateful dropout would draw new masks when recomputed, and the gradients would belong to
a different network than the loss). For that reason dropout is applied to the embeddings
and to each residual branch (GPT-2's embedding and residual dropout), not to the
attention probabilities, whose mask `MultiHeadAttention` draws from its own stateful
generator.

Example:

    from tfaccel.train import gpt

    config = gpt.gpt_config("tiny", vocab_size=104)
    model = gpt.build_gpt(config)                       # 828,160 parameters
    lean = gpt.with_recompute(model)                    # same weights, recomputing blocks
    gpt.check_sequence_length(model, 64)                # 65 would raise ModelError
    assert gpt.gpt_config_of(lean) == config
"""

import dataclasses
import math
import numbers

from tfaccel.choices import GPT_SIZES
from tfaccel.errors import ModelError
from tfaccel.keras import keras
from tfaccel.train.gpt_layers import (
    LN_EPSILON,
    Float32LayerNorm,
    PositionEmbedding,
    RecomputeBlock,
    ResidualAdd,
    StreamDropout,
    TiedEmbedding,
    block_forward,
    block_layers,
    check_context,
    init_stddev,
    normal,
)

__all__ = ["GPT_SIZES", "GPTConfig", "gpt_config", "build_gpt", "gpt_config_of",
           "with_recompute", "check_sequence_length", "PositionEmbedding", "TiedEmbedding",
           "RecomputeBlock", "ResidualAdd", "StreamDropout", "Float32LayerNorm"]


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """The shape of a GPT: vocabulary, context, depth, width, dropout, tied embeddings.

    Raises:
      ModelError: a size that is not a positive integer, `heads` that do not divide
        `d_model`, or a dropout outside [0, 1).
    """

    vocab_size: int
    context: int = 64
    layers: int = 4
    heads: int = 4
    d_model: int = 128
    mlp_ratio: int = 4
    dropout: float = 0.0
    tie_embeddings: bool = False

    def __post_init__(self):
        for field in ("vocab_size", "context", "layers", "heads", "d_model", "mlp_ratio"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ModelError(f"GPT {field}={value!r}: give a positive whole number")
            object.__setattr__(self, field, int(value))  # a NumPy integer becomes an int
        if self.d_model % self.heads:
            divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
            raise ModelError(
                f"GPT heads={self.heads} does not divide d_model={self.d_model} (each head gets "
                f"d_model/heads dimensions): use heads in {', '.join(map(str, divisors))}, or a "
                f"d_model that is a multiple of {self.heads} (e.g. "
                f"{math.ceil(self.d_model / self.heads) * self.heads})")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, numbers.Real) or \
                not 0 <= self.dropout < 1:
            raise ModelError(f"GPT dropout={self.dropout!r}: give a rate in [0, 1), e.g. 0.1")
        object.__setattr__(self, "dropout", float(self.dropout))
        if not isinstance(self.tie_embeddings, bool):
            raise ModelError(f"GPT tie_embeddings={self.tie_embeddings!r}: give True or False")

    def to_json(self):
        """The fields as a JSON-ready dict (`GPTConfig(**d)` rebuilds it)."""
        return dataclasses.asdict(self)


def gpt_config(size="tiny", vocab_size=None, **overrides):
    """The `GPTConfig` of named size `size` (see `GPT_SIZES`), with `overrides` applied.

    An override of None keeps the size's value (so unset flags can be passed as they are).

    Raises:
      ModelError: unknown size or field, no `vocab_size`, or an invalid result.
    """
    if size not in GPT_SIZES:
        raise ModelError(f"unknown GPT size {size!r}: use one of {', '.join(GPT_SIZES)}")
    if vocab_size is None:
        raise ModelError("gpt_config needs vocab_size: pass the vocabulary's size "
                         "(e.g. vocab.size)")
    fields = {f.name for f in dataclasses.fields(GPTConfig)} - {"vocab_size"}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ModelError(f"unknown GPT setting {', '.join(unknown)}: use some of "
                         f"{', '.join(sorted(fields))}")
    values = dict(GPT_SIZES[size], **{k: v for k, v in overrides.items() if v is not None})
    return GPTConfig(vocab_size=vocab_size, **values)


# ------------------------------------------------------------------ building and reading back


def build_gpt(config, recompute=False, name="gpt"):
    """A GPT language model of `config`: int32 tokens `[batch, T<=context]` -> float32 logits.

    Build it after setting the precision policy (the blocks compute under the global
    policy, the logits layer and the parts `gpt_layers` names in float32) and inside the
    strategy's scope.

    Args:
      config: a `GPTConfig` (see `gpt_config`).
      recompute: recompute each block's activations in the backward pass
        (`RecomputeBlock`): less memory, about one more forward pass of compute.
      name: the model's name.

    Returns:
      An uncompiled tf_keras functional model with input "tokens".
    """
    if not isinstance(config, GPTConfig):
        raise ModelError(f"build_gpt needs a GPTConfig, got {type(config).__name__}: make one "
                         "with tfaccel.train.gpt.gpt_config(size, vocab_size=...)")
    return _build(config, bool(recompute), name, dtype=None)


def _build(config, recompute, name, dtype):
    kw = {} if dtype is None else {"dtype": dtype}
    d = config.d_model
    std = init_stddev(d)
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    if config.tie_embeddings:  # also the logits layer, so float32
        embedding = TiedEmbedding(config.vocab_size, d, embeddings_initializer=normal(std),
                                  dtype="float32", name="token_embedding")
    else:
        embedding = keras.layers.Embedding(config.vocab_size, d,
                                           embeddings_initializer=normal(std),
                                           name="token_embedding", **kw)
    x = PositionEmbedding(config.context, initializer=normal(std), name="position_embedding",
                          **kw)(embedding(tokens))
    if config.dropout:
        x = StreamDropout(config.dropout, name="embedding_dropout", **kw)(x)
    residual_stddev = std / math.sqrt(2 * config.layers)
    for i in range(config.layers):
        if recompute:
            x = RecomputeBlock(d, config.heads, config.mlp_ratio, config.dropout,
                               residual_stddev, name=f"block_{i}", **kw)(x)
        else:
            x = block_forward(block_layers(f"block_{i}", d, config.heads, config.mlp_ratio,
                                           config.dropout, residual_stddev, dtype), x)
    x = Float32LayerNorm(epsilon=LN_EPSILON, name="final_ln", **kw)(x)
    if config.tie_embeddings:
        logits = embedding(x, reverse=True)
    else:
        logits = keras.layers.Dense(config.vocab_size, use_bias=False,
                                    kernel_initializer=normal(std), dtype="float32",
                                    name="logits")(x)
    return keras.Model(tokens, logits, name=name)


def _flat_layers(model):
    """`model`'s layers with wrappers (pruning, quantization) unwrapped and blocks opened."""
    for layer in getattr(model, "layers", ()):
        while isinstance(layer, keras.layers.Wrapper):
            layer = layer.layer
        if isinstance(layer, RecomputeBlock):
            yield layer
            yield from layer.block_layers.values()
        else:
            yield layer


def gpt_config_of(model):
    """The `GPTConfig` of a model `build_gpt` made (built, loaded, copied or wrapped), else None.

    Read from the model's layers (embedding sizes, position embedding, attention layers,
    MLP width, dropout rate), so it holds for a model loaded from a .keras file too.
    """
    layers = list(_flat_layers(model))
    by_name = {layer.name: layer for layer in layers}
    embedding, position = by_name.get("token_embedding"), by_name.get("position_embedding")
    attention = [layer for layer in layers if isinstance(layer, keras.layers.MultiHeadAttention)]
    fc = by_name.get("block_0_mlp_fc")
    if not (isinstance(embedding, keras.layers.Embedding)
            and isinstance(position, PositionEmbedding) and attention and fc is not None):
        return None
    dropout = by_name.get("embedding_dropout")
    return GPTConfig(vocab_size=int(embedding.input_dim), context=position.context,
                     layers=len(attention), heads=int(attention[0].get_config()["num_heads"]),
                     d_model=int(embedding.output_dim),
                     mlp_ratio=int(fc.units) // int(embedding.output_dim),
                     dropout=float(dropout.rate) if dropout is not None else 0.0,
                     tie_embeddings=isinstance(embedding, TiedEmbedding))


def _gpt_config_or_raise(model, what):
    config = gpt_config_of(model)
    if config is None:
        raise ModelError(f"{what}: model {getattr(model, 'name', model)!r} is not a GPT made by "
                         "tfaccel.train.gpt.build_gpt: build it with build_gpt")
    return config


def with_recompute(model, recompute=True):
    """A copy of GPT `model` with the same weights, recomputing its blocks or not.

    The copy computes under the same precision policy as `model`, is built in the
    current strategy scope, and is not compiled (compile it, or copy the optimizer
    yourself). `with_recompute(model, False)` is the plain model, e.g. for export.

    Raises:
      ModelError: `model` is not a `build_gpt` model, or it carries extra weights (a
        pruned model: strip the pruning wrappers first).
    """
    config = _gpt_config_or_raise(model, "with_recompute")
    policy = {layer.name: layer for layer in _flat_layers(model)}["block_0_ln_1"].dtype_policy
    copy = _build(config, bool(recompute), model.name, dtype=policy.name)
    if len(copy.weights) != len(model.weights):
        raise ModelError(f"with_recompute: model {model.name!r} has {len(model.weights)} weights, "
                         f"a GPT of its configuration {len(copy.weights)}: strip pruning or "
                         "quantization wrappers first (e.g. tfmot's strip_pruning)")
    copy.set_weights(model.get_weights())
    return copy


def check_sequence_length(config_or_model, sequence_length):
    """Returns `sequence_length` if the model (or `GPTConfig`, or a context) can take it.

    Raises:
      ModelError: a length below 1, or above the model's context.
    """
    if isinstance(config_or_model, GPTConfig):
        context = config_or_model.context
    elif isinstance(config_or_model, int):
        context = config_or_model
    else:
        context = _gpt_config_or_raise(config_or_model, "check_sequence_length").context
    length = int(sequence_length)
    if length < 1:
        raise ModelError(f"sequence length {length}: give at least 1 token")
    check_context(length, context)
    return length
