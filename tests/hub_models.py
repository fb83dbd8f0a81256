"""Small KerasHub models built from configs (nothing downloaded), shared by the tests."""

import pytest


def gpt2_and_bert(vocabulary_size=100, layers=1, heads=2, hidden=32, intermediate=64,
                  max_length=16, num_classes=2):
    """(GPT2CausalLM, BertTextClassifier) of that size, without preprocessors; the test is
    skipped where KerasHub is not installed."""
    keras_hub = pytest.importorskip("keras_hub")
    size = dict(vocabulary_size=vocabulary_size, num_layers=layers, num_heads=heads,
                hidden_dim=hidden, intermediate_dim=intermediate,
                max_sequence_length=max_length)
    gpt2 = keras_hub.models.GPT2CausalLM(backbone=keras_hub.models.GPT2Backbone(**size),
                                         preprocessor=None)
    bert = keras_hub.models.BertTextClassifier(backbone=keras_hub.models.BertBackbone(**size),
                                               num_classes=num_classes, preprocessor=None)
    return gpt2, bert
