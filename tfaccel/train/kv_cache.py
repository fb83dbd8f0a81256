"""Key/value caches for generation: a prefill of the prompt, then one-token decode steps.

`tfaccel.train.generate.generate` asks `decoder_for(model, context)` for a model's cache.
Two kinds of model have one:

- **tfaccel's GPT** (`build_gpt`, plain or `with_recompute`, built, copied or loaded from
  a .keras file, under any precision policy): `GPTDecoder` runs the model's own layers and
  weights (read when each step runs, so a model in training samples with its current
  weights). The prefill replays the model's graph on a fixed `[1, context]` window (the
  same layers, so the same logits as calling the model) and also projects each block's
  keys and values; a decode step embeds one token at its position, attends over the
  cached keys and values of the positions before it, and writes its own. The cache is
  preallocated at the window's length (`[heads, context, head_dim]` per block, keys and
  values, in the attention's compute dtype: bfloat16 under mixed_bfloat16), so both
  steps are `tf.function`s of fixed shapes, traced once per model: no retracing per
  token or prompt length. The attention follows `MultiHeadAttention`'s arithmetic (the
  query scaled by 1/sqrt(head_dim) before the dot product, masked positions pushed to
  -1e9, results rounded to the compute dtype where its kernels round, weights cast to
  it as the layer's autocast casts them). In float32 the logits are the model's own to
  about 1e-6; under 16-bit policies to the 16-bit rounding (tests/test_kv_cache.py).
- **KerasHub causal LMs** (e.g. `keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)`):
  `KerasHubDecoder` uses KerasHub's own cache, `call_with_cache` (seeded as KerasHub's
  `generate` seeds it), with tfaccel's sampling on the host.

Any other model gets None, and `generate` runs its whole window for every token.

Example:

    from tfaccel.train import kv_cache

    decoder = kv_cache.decoder_for(model, 64)
    logits, cache = decoder.prefill(window, tf.constant(n))         # logits at n - 1
    logits, cache = decoder.decode(tf.constant(token), tf.constant(n), cache)
"""

import math
import weakref

import tensorflow as tf

from tfaccel import _compat
from tfaccel.errors import ModelError
from tfaccel.keras import is_keras3_object
from tfaccel.train.gpt import gpt_config_of
from tfaccel.train.gpt_layers import check_context

# model -> {context: decoder}; an entry goes with its model.
_DECODERS = weakref.WeakKeyDictionary()

_PROJECTIONS = ("query", "key", "value", "attention_output")


def is_keras_hub_causal_lm(model):
    """True for a KerasHub causal LM (a Keras 3 model with `call_with_cache`)."""
    return is_keras3_object(model) and callable(getattr(model, "call_with_cache", None))


def takes_token_dict(model):
    """True for a model taking KerasHub's `{"token_ids", "padding_mask"}` (a KerasHub causal
    LM, or a functional model of your own with those inputs)."""
    if is_keras_hub_causal_lm(model):
        return True
    try:
        inputs = model.input
    except (AttributeError, ValueError):  # not built, or subclassed
        return False
    return isinstance(inputs, dict) and "token_ids" in inputs


def model_inputs(model, window):
    """What `model` takes for token ids `window` `[batch, T]`: the ids, or KerasHub's dict
    (all ids real: the causal mask keeps right padding from the positions read)."""
    if takes_token_dict(model):
        return {"token_ids": window, "padding_mask": tf.ones_like(window, tf.bool)}
    return window


def keras_hub_context(model):
    """A KerasHub causal LM's longest sequence (its backbone's `max_sequence_length`), or None."""
    length = getattr(getattr(model, "backbone", None), "max_sequence_length", None)
    return int(length) if length else None


def decoder_for(model, context):
    """The cached decoder of `model` for a `context`-token window, or None if it has none.

    Made once per (model, context) and kept with the model.

    Raises:
      ModelError: `context` is beyond the GPT's (or the KerasHub model's) longest sequence.
    """
    per_model = _DECODERS.setdefault(model, {})
    if context not in per_model:
        if gpt_config_of(model) is not None:
            per_model[context] = GPTDecoder(model, context)
        elif is_keras_hub_causal_lm(model):
            per_model[context] = KerasHubDecoder(model, context)
        else:
            per_model[context] = None
    return per_model[context]


# ------------------------------------------------------------------ tfaccel's GPT


def _block(model, i):
    """{part: layer} of block `i` of a plain or recomputing GPT (`ln_1`, `attn`, ...)."""
    try:
        return dict(model.get_layer(f"block_{i}").block_layers)  # a RecomputeBlock
    except ValueError:
        return {part: model.get_layer(f"block_{i}_{part}")
                for part in ("ln_1", "attn", "attn_add", "ln_2", "mlp_fc", "mlp_proj", "mlp_add")}


def _attention_weights(attention):
    """The query, key, value and output (kernel, bias) variables of a MultiHeadAttention."""
    named = {}
    for weight in attention.weights:
        projection, kind = weight.name.split(":")[0].split("/")[-2:]
        named[projection, kind] = weight
    try:
        return [(named[p, "kernel"], named[p, "bias"]) for p in _PROJECTIONS]
    except KeyError as e:
        raise ModelError(f"attention layer {attention.name!r} has no {e.args[0]} weight: "
                         "generate with use_cache=False") from None


def _large_negative(dtype):
    """What tf_keras's masked Softmax adds at masked positions."""
    return tf.float16.min / 2.0 if dtype == tf.float16 else -1e9


class GPTDecoder:
    """Prefill and one-token decode steps of a `build_gpt` model, with a preallocated cache.

    The cache is a pair of tuples: each block's keys and values `[heads, context,
    head_dim]` in the attention's compute dtype, and each block's attention weights as
    the decode step uses them (query/key/value kernels side by side `[d, 3 d]`, their
    biases, the output kernel `[d, d]` and bias), cast and laid out once per prefill
    rather than on every token.

    Args:
      model: a GPT from `build_gpt` (plain or recomputing, any precision policy).
      context: the window (at most the model's context).

    Raises:
      ModelError: `context` is beyond the model's context.
    """

    def __init__(self, model, context):
        config = gpt_config_of(model)
        check_context(int(context), config.context)
        self.context, self.layers = int(context), config.layers
        self.heads, self.head_dim = config.heads, config.d_model // config.heads
        self.tied = config.tie_embeddings
        self.dtype = tf.as_dtype(_block(model, 0)["attn"].compute_dtype)
        d = config.d_model
        ref = weakref.ref(model)  # the functions must not keep the model alive
        self.prefill = tf.function(lambda window, n: self.run_prefill(ref(), window, n),
                                   input_signature=[tf.TensorSpec([1, self.context], tf.int32),
                                                    tf.TensorSpec([], tf.int32)])
        spec = tf.TensorSpec([self.heads, self.context, self.head_dim], self.dtype)
        weights = (tf.TensorSpec([d, 3 * d], self.dtype), tf.TensorSpec([3 * d], self.dtype),
                   tf.TensorSpec([d, d], self.dtype), tf.TensorSpec([d], self.dtype))
        self.decode = tf.function(lambda token, position, cache: self.run_decode(
            ref(), token, position, cache), input_signature=[
                tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32),
                ((spec,) * (2 * self.layers), weights * self.layers)])

    def _attention_weights(self, attention):
        """(qkv kernel `[d, 3 d]`, qkv bias, output kernel `[d, d]`, output bias) in the
        compute dtype, cast as the layer's autocast casts them."""
        (wq, bq), (wk, bk), (wv, bv), (wo, bo) = _attention_weights(attention)
        d = wq.shape[0]
        kernel = tf.concat([tf.reshape(w, [d, -1]) for w in (wq, wk, wv)], axis=1)
        bias = tf.concat([tf.reshape(b, [-1]) for b in (bq, bk, bv)], axis=0)
        return tuple(tf.cast(w, self.dtype)
                     for w in (kernel, bias, tf.reshape(wo, [-1, d]), bo))

    def _logits(self, model, x):
        x = model.get_layer("final_ln")(x)
        if self.tied:
            return model.get_layer("token_embedding")(x, reverse=True)
        return model.get_layer("logits")(x)

    def _project(self, h, kernel, bias):
        """`h` `[T, d]` -> (queries, keys, values), each `[heads, T, head_dim]`.

        One matmul rather than the layer's three einsums: at these sizes each op costs
        a few microseconds of TensorFlow's overhead, about as much as its arithmetic.
        """
        qkv = tf.reshape(tf.matmul(h, kernel) + bias, [-1, 3, self.heads, self.head_dim])
        return tf.unstack(tf.transpose(qkv, [1, 2, 0, 3]))

    def run_prefill(self, model, window, n):
        """(float32 logits `[vocab]` at position n - 1, the cache of the window's positions).

        The model's own layers on the whole window, as calling the model runs them, plus
        each block's keys and values (positions from n on hold padding's, which decode
        steps never read before overwriting them).
        """
        x = model.get_layer("position_embedding")(model.get_layer("token_embedding")(window))
        keys_values, weights = [], []
        for i in range(self.layers):
            block = _block(model, i)
            h = block["ln_1"](x)
            attended = block["attn"](h, h, use_causal_mask=True)
            weights += self._attention_weights(block["attn"])
            keys_values += self._project(tf.cast(h[0], self.dtype), *weights[-4:-2])[1:]
            x = block["attn_add"]([x, attended])
            x = block["mlp_add"]([x, block["mlp_proj"](block["mlp_fc"](block["ln_2"](x)))])
        logits = self._logits(model, x)
        return tf.cast(logits[0, n - 1], tf.float32), (tuple(keys_values), tuple(weights))

    def run_decode(self, model, token, position, cache):
        """(float32 logits `[vocab]` after `token` at `position`, the cache with its keys
        and values written there); positions after `position` are masked out.

        The attention of one query is products and sums with the softmax written out
        (oneDNN's softmax op took ~55 us a call here, exp, sum and divide ~8 us),
        accumulated in float32 and rounded to the compute dtype where
        `MultiHeadAttention`'s kernels round.
        """
        keys_values, weights = cache
        x = model.get_layer("token_embedding")(tf.reshape(token, [1, 1]))
        positions = model.get_layer("position_embedding")
        x = _f32(x) + _f32(positions.embeddings[position])[None, None]  # the float32 stream
        masked = (1.0 - tf.cast(tf.range(self.context) <= position, self.dtype)) * \
            _large_negative(self.dtype)
        at = tf.stack([tf.range(self.heads), tf.fill([self.heads], position)], axis=1)
        written = []
        for i in range(self.layers):
            block = _block(model, i)
            qkv_kernel, qkv_bias, out_kernel, out_bias = weights[4 * i:4 * i + 4]
            h = tf.cast(block["ln_1"](x)[0], self.dtype)                      # [1, d]
            query, key, value = self._project(h, qkv_kernel, qkv_bias)        # [heads, 1, hd]
            keys = tf.tensor_scatter_nd_update(keys_values[2 * i], at, key[:, 0])
            values = tf.tensor_scatter_nd_update(keys_values[2 * i + 1], at, value[:, 0])
            query = tf.multiply(query, 1.0 / math.sqrt(float(self.head_dim)))
            scores = tf.reduce_sum(_f32(keys) * _f32(query), axis=-1)        # [heads, C]
            scores = _f32(tf.cast(scores, self.dtype) + masked)
            probs = tf.exp(scores - tf.reduce_max(scores, axis=-1, keepdims=True))
            probs = _f32(tf.cast(probs / tf.reduce_sum(probs, axis=-1, keepdims=True),
                                 self.dtype))
            attended = tf.reduce_sum(probs[:, :, None] * _f32(values), axis=1)  # [heads, hd]
            attended = tf.matmul(tf.cast(tf.reshape(attended, [1, -1]), self.dtype),
                                 out_kernel) + out_bias
            written += [keys, values]
            x = block["attn_add"]([x, attended[None]])
            x = block["mlp_add"]([x, block["mlp_proj"](block["mlp_fc"](block["ln_2"](x)))])
        logits = self._logits(model, x)
        return tf.cast(logits[0, 0], tf.float32), (tuple(written), weights)


def _f32(x):
    return tf.cast(x, tf.float32)


# ------------------------------------------------------------------ KerasHub


class KerasHubDecoder:
    """Prefill and decode steps of a KerasHub causal LM through its own `call_with_cache`.

    The prefill seeds KerasHub's cache from the whole window (as its `generate` does) and
    reads the logits at n - 1 by running that token again at its position, which is also
    what KerasHub's `generate` does before its first new token.

    Raises:
      ModelError: `context` is beyond the model's `max_sequence_length`.
    """

    def __init__(self, model, context):
        longest = keras_hub_context(model)
        if longest is not None:
            check_context(int(context), longest)
        self.context = int(context)
        ref = weakref.ref(model)

        def prefill(window, n):
            cache = _compat.keras_hub_seeded_cache(ref(), window)
            return decode(window[0, n - 1], n - 1, cache)

        def decode(token, position, cache):
            logits, _, cache = ref().call_with_cache(tf.reshape(token, [1, 1]), cache,
                                                     position)
            return tf.cast(logits[0, 0], tf.float32), cache

        # The cache's shape is the model's own: traced once on the first call.
        self.prefill = tf.function(prefill, input_signature=[
            tf.TensorSpec([1, self.context], tf.int32), tf.TensorSpec([], tf.int32)])
        self.decode = tf.function(decode)
