"""Language models as a user's `--model_fn=user_lms:<name>` would return them (Keras 3),
and the wrong kinds the checks must refuse; shared by test_causal_lm and the recipe tests."""

import keras


def bigram(vocabulary_size, sequence_length):
    """A causal LM of the simplest kind: position t's logits from token t alone."""
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(vocabulary_size, 16)(ids)
    return keras.Model(ids, keras.layers.Dense(vocabulary_size)(x))


def pooled(vocabulary_size, sequence_length):
    """Not a language model: one prediction per window."""
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(vocabulary_size, 8)(ids))
    return keras.Model(ids, keras.layers.Dense(vocabulary_size)(x))


def hub(vocabulary_size, sequence_length):
    """KerasHub's GPT2CausalLM (kept as it is: its class and its cache)."""
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(vocabulary_size, 1, 2, 8, 16,
                                             max_sequence_length=sequence_length)
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def wrong_signature(vocab, length):
    return None


def tf_keras_model(vocabulary_size, sequence_length):
    """A tf_keras model: the Keras 3 lane refuses it."""
    import tf_keras

    ids = tf_keras.Input((None,), dtype="int32")
    return tf_keras.Model(ids, tf_keras.layers.Embedding(vocabulary_size, vocabulary_size)(ids))
