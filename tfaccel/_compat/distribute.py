"""Private touchpoints: distribute and data (tf.distribute, tf.data)."""

def num_workers(strategy):
    """Worker processes training together under `strategy` (1 unless multi-worker).

    Relies on the private `strategy.extended._num_workers` (set by the multi-worker and
    parameter-server strategies, absent from the others). Checked: TF 2.21.
    """
    return int(getattr(strategy.extended, "_num_workers", 1) or 1)


def strategy_name(strategy):
    """The name users know `strategy` by: 'default', or its `tf.distribute` class name.

    Relies on the private class name of the default strategy,
    `_DefaultDistributionStrategy`, and on `tf.distribute.MultiWorkerMirroredStrategy`
    being the class `CollectiveAllReduceStrategy`. Checked: TF 2.21.
    """
    public = {"_DefaultDistributionStrategy": "default",
              "CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy"}
    return public.get(type(strategy).__name__, type(strategy).__name__)


def serialized_dataset_graph(dataset):
    """The serialized `GraphDef` (bytes) of `dataset`: what tf.data's auto-shard rewrite reads.

    Relies on the private `tf.data.Dataset._as_serialized_graph()`. Checked: TF 2.21.
    """
    return dataset._as_serialized_graph().numpy()
