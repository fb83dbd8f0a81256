"""What every data source returns: `Splits` of unbatched datasets and their `DatasetInfo`.

The loaders (`sources`, `tfrecord`, `tfds`) build these and the pipeline
builder reads them; they live here, apart from every loader, so that no
loader imports another to name them.

Example:

    from tfaccel.data import load_dataset

    splits = load_dataset("digits")
    splits.info.num_examples   # {'train': 1257, 'validation': 180, 'test': 360}
"""

import dataclasses

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model and a pipeline need to know about a dataset."""

    name: str
    input_shape: tuple
    num_classes: int
    class_names: tuple
    num_examples: dict
    in_memory: bool = True
    """True when the examples live in memory (auto-shard by DATA), False for files."""


@dataclasses.dataclass(frozen=True)
class Splits:
    """Unbatched train / validation / test datasets of ``(x, label)`` plus their info."""

    train: tf.data.Dataset
    validation: tf.data.Dataset
    test: tf.data.Dataset
    info: DatasetInfo
    files: dict | None = None
    """For file sources: {'train': [paths], ...}, the files behind each split."""
    bad_files: tuple = ()
    """(file, reason) of each file or record skipped with on_bad_example='skip'."""
