"""Distribution: `tf.distribute` strategies from one name, the batch arithmetic and file rules
that go with them, and a local multi-worker launcher.

The package's public names are those of its modules, loaded on first use (so
`tfaccel launch` starts without TensorFlow):

    from tfaccel import distribute

    strategy = distribute.make_strategy("auto")          # tfaccel.distribute.strategy
    per_replica = distribute.per_replica_batch_size(64, strategy.num_replicas_in_sync)
"""

import importlib

_MODULES = ("tfaccel.distribute.strategy", "tfaccel.distribute.batching")


def __getattr__(name):
    if not name.startswith("_"):
        for module_name in _MODULES:
            module = importlib.import_module(module_name)
            if name in module.__all__:
                value = getattr(module, name)
                globals()[name] = value
                return value
    raise AttributeError(f"module 'tfaccel.distribute' has no attribute {name!r}")
