"""Distribution: `tf.distribute` strategies from one name, the batch arithmetic and file rules
that go with them, and a local multi-worker launcher. (Model and pipeline parallelism live in
`tfaccel.parallel`, above the planner they use; `tfaccel.distribute.stages` and
`tfaccel.distribute.pipeline` are aliases of those modules.)

The package's public names are those of its modules, loaded on first use (so
`tfaccel launch` starts without TensorFlow):

    from tfaccel import distribute

    strategy = distribute.make_strategy("auto")          # tfaccel.distribute.strategy
    per_replica = distribute.per_replica_batch_size(64, strategy.num_replicas_in_sync)
"""

import warnings

from tfaccel import _aliases

_MODULES = ("tfaccel.distribute.strategy", "tfaccel.distribute.batching",
            "tfaccel.parallel.stages", "tfaccel.parallel.pipeline")


def _scale_learning_rate_by_replicas(learning_rate, num_replicas):
    """0.1.0's `distribute.scale_learning_rate(lr, num_replicas)`: `lr` times the replicas.

    Deprecated: the one rule is `distribute.batching.scale_learning_rate(lr,
    global_batch_size, base_batch_size)`; this is it with a base batch of 1.
    """
    warnings.warn("tfaccel.distribute.scale_learning_rate(lr, num_replicas) is deprecated: use "
                  "tfaccel.scale_learning_rate(lr, num_replicas, base_batch_size=1)",
                  DeprecationWarning, stacklevel=2)
    from tfaccel.distribute import batching  # deferred: TensorFlow (batching loads it)

    return batching.scale_learning_rate(learning_rate, num_replicas, base_batch_size=1)


# scale_learning_rate keeps its 0.1.0 meaning here (lr x replicas).
__getattr__ = _aliases.submodule_getattr(
    __name__, _MODULES, names={"scale_learning_rate": _scale_learning_rate_by_replicas})
