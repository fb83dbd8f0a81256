"""Windows of a token stream as batches for a language model: `text_dataset`, `num_windows`.

A language model learns from every position of its text, so the training
windows start at every token (stride 1), and each window of ``L + 1`` tokens
gives the inputs ``x = w[:-1]`` and the next-token targets ``y = w[1:]``.
The token array stays one int32 tensor and whole batches of windows are
gathered from it in one vectorized map: nothing of size windows x L is ever
built (420k windows of 65 tokens would be 109 MB for a 1.7 MB text).

The shuffle is a random permutation of the window starts computed on the fly
(``tf.random.experimental.index_shuffle``, a seeded bijection of 0..n-1), not
a ``shuffle`` buffer: a buffer holding every start would cost about 190 bytes
per window (82 MB for the default corpus, 770 MB for 4M windows, measured),
while a smaller buffer would keep neighbouring windows together. Pass p is
shuffled with the seed (seed, p), and the epoch number is read from a variable
when an iteration starts, the rule `tfaccel.data.pipeline` follows for images,
so that epoch k of a resumed run sees the uninterrupted run's windows.

Example:

    import numpy as np
    from tfaccel.data.text_pipeline import num_windows, text_dataset

    tokens = np.arange(1000, dtype=np.int32)
    train = text_dataset(tokens, sequence_length=64, batch_size=12, training=True, seed=0)
    x, y = next(iter(train))                  # int32 [12, 64]; y[:, :-1] == x[:, 1:]
    print(num_windows(1000, 64, training=True), num_windows(1000, 64, training=False))  # 936 15
"""

import numbers

import numpy as np
import tensorflow as tf

from tfaccel.data.pipeline_config import PipelineConfig, pipeline_options
from tfaccel.errors import ConfigError, DataError


def num_windows(num_tokens, sequence_length, training):
    """Windows of `sequence_length` inputs (plus one target token) in `num_tokens` tokens.

    Training windows start at every token (stride 1): ``num_tokens - L``.
    Evaluation windows do not overlap (stride L): ``(num_tokens - 1) // L``,
    so every token is scored once and the last window still has its target.
    """
    num_tokens, length = int(num_tokens), int(sequence_length)
    if training:
        return max(0, num_tokens - length)
    return max(0, (num_tokens - 1) // length)


def _positive(name, value, example):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"{name}={value!r} must be a positive integer, e.g. {example}")
    return int(value)


def _epoch_keys(seed, epoch):
    """One int64 per iteration, read when the iteration starts: the epoch's number; without
    an epoch, the iterations started so far (0, 1, 2, ...: the same keys in every process for
    a seed, whatever global seed the process set); without a seed, tf.data's randomness.

    (`Dataset.random(seed, rerandomize_each_iteration=True)` is not used with a seed: its keys
    depend on the process's global seed and, measured in the test suite, repeated a key.)
    """
    if seed is None:
        return tf.data.Dataset.random(rerandomize_each_iteration=True).take(1)
    if epoch is None:
        started = tf.Variable(-1, dtype=tf.int64, trainable=False, name="text_passes")
        return tf.data.Dataset.from_tensors(0).map(lambda _: started.assign_add(1))
    return tf.data.Dataset.from_tensors(0).map(
        lambda _: tf.cast(tf.convert_to_tensor(epoch), tf.int64))


def text_dataset(tokens, sequence_length, batch_size, training, seed=0, epoch=None,
                 drop_remainder=True, steps_per_epoch=None):
    """Batches of (inputs, next-token targets) windows of a token array.

    Training takes every window start once per pass (stride 1) in a random
    order; evaluation takes non-overlapping windows in order and caches its
    batches after the first pass. One iteration is one epoch: a whole pass, or
    `steps_per_epoch` batches of an endless stream of passes (a pass of the
    default corpus is 34,873 batches of 12: longer than most runs).

    Example:

        from tfaccel.data import text
        from tfaccel.train.resume import EpochCounter

        splits = text.load_text_dataset(sequence_length=64)
        counter = EpochCounter()
        train = text.text_dataset(splits.train, 64, 12, training=True, seed=0,
                                  epoch=counter.epoch, steps_per_epoch=200)
        val = text.text_dataset(splits.validation, 64, 12, training=False,
                                drop_remainder=False)
        # model.fit(train, validation_data=val, epochs=10, steps_per_epoch=200,
        #           callbacks=[counter])

    Args:
      tokens: 1-D int token ids (NumPy array, list or tensor), e.g. `TextSplits.train`.
      sequence_length: L, the tokens a model sees per window.
      batch_size: windows per batch.
      training: every start, shuffled (True), or non-overlapping windows in order (False).
      seed: shuffle seed (training). None: a new, unreproducible order each pass.
      epoch: optional int64 `tf.Variable` holding the epoch being trained, e.g.
        `tfaccel.train.resume.EpochCounter().epoch`, read when an iteration starts: epoch k
        is then a function of (seed, k) alone, the same in an uninterrupted and in a resumed
        run. Keras makes a new iterator each epoch when the dataset's cardinality equals
        `fit`'s ``steps_per_epoch`` (or none is given); nothing advances the variable
        between the passes of a ``.repeat()``. Without it, each iteration gets a new order,
        the same sequence of orders in every run with this seed.
      drop_remainder: drop the last partial batch (static batch shape, as strategies need).
      steps_per_epoch: training only: batches per iteration; epoch k is then batches
        ``k * steps_per_epoch ..`` of the stream of passes (pass p shuffled with (seed, p)),
        so every window is still seen once per pass. None: one pass per iteration.

    Returns:
      A `tf.data.Dataset` of ``(x, y)``, both int32 ``[batch, sequence_length]`` with
      ``y[:, i] == x[:, i + 1]`` (``y[:, -1]`` the token after the window); its
      cardinality is the number of batches in one iteration.

    Raises:
      ConfigError: `sequence_length`, `batch_size` or `steps_per_epoch` not a positive
        integer.
      DataError: `tokens` not 1-D, or too few of them for one batch of windows.
    """
    length = _positive("sequence_length", sequence_length, 64)
    batch = _positive("batch_size", batch_size, 12)
    values = tf.convert_to_tensor(np.asarray(tokens) if not tf.is_tensor(tokens) else tokens)
    if values.shape.rank != 1 or not values.dtype.is_integer:
        raise DataError(f"tokens must be a 1-D array of integer token ids, got {values.dtype.name} "
                        f"of shape {values.shape}: pass TextSplits.train or .validation")
    values = tf.cast(values, tf.int32)
    count = num_windows(int(values.shape[0]), length, training)
    batches = count // batch if drop_remainder else -(-count // batch)
    if batches == 0:
        what = "stride-1" if training else f"non-overlapping {length}-token"
        raise DataError(f"{int(values.shape[0])} tokens give {count} {what} windows of "
                        f"sequence_length={length}, not one batch of {batch}: give more text, or "
                        "a smaller --batch_size or --sequence_length")
    offsets = tf.range(length + 1, dtype=tf.int64)

    def windows(starts):
        w = tf.gather(values, starts[:, None] + offsets[None, :])
        return w[:, :-1], w[:, 1:]

    if training:
        per_pass = batches
        batches = per_pass if steps_per_epoch is None else _positive(
            "steps_per_epoch", steps_per_epoch, 1000)
        seed_value = 0 if seed is None else int(seed) % 2**63
        by_epoch = epoch is not None and seed is not None

        def one_epoch(key):
            # Epoch e is batches e*S .. e*S+S-1 of an endless stream of passes, pass p shuffled
            # with (seed, p); without an epoch, the stream's passes are numbered from `key`.
            first, base = (key * batches, 0) if by_epoch else (0, key)

            def batch_of(j):
                g = first + j
                position = (g % per_pass) * batch
                index = tf.range(position, tf.minimum(position + batch, count))
                if drop_remainder:  # a static batch shape
                    index = tf.ensure_shape(index, [batch])
                pair = tf.stack([tf.constant(seed_value, tf.int64), base + g // per_pass])
                return windows(tf.random.experimental.index_shuffle(index, pair, count - 1))

            return tf.data.Dataset.range(batches).map(
                batch_of, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

        dataset = _epoch_keys(seed_value if seed is not None else None, epoch).flat_map(one_epoch)
        # flat_map hides the cardinality; Keras needs it to count steps
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(batches))
    else:
        dataset = tf.data.Dataset.range(0, count * length, length).batch(
            batch, drop_remainder=drop_remainder).map(windows, num_parallel_calls=tf.data.AUTOTUNE,
                                                     deterministic=True).cache()
    options = pipeline_options(PipelineConfig(batch_size=batch, deterministic=True))
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)
