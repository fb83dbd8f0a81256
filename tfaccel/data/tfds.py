"""TensorFlow Datasets as a source, when the package is installed and the data is on disk.

Example:

    from tfaccel.data.tfds import load_tfds

    splits = load_tfds("mnist", image_size=(28, 28))   # never downloads
"""

import os

import tensorflow as tf

from tfaccel.data.types import DatasetInfo, Splits
from tfaccel.errors import DataError


def load_tfds(name, data_dir=None, image_size=(64, 64)) -> Splits:
    """A TensorFlow Datasets dataset that is installed and already on disk (never downloads).

    `name` may carry a version (``"mnist:3.0.1"``); splits 'train', 'validation' (if
    any, else none) and 'test'. Images are scaled to [0, 1] and resized to `image_size`.

    Raises:
      DataError: tensorflow_datasets is not installed, or the data is not prepared.
    """
    try:
        import tensorflow_datasets as tfds  # deferred: tensorflow_datasets, optional
    except ImportError:
        raise DataError("dataset 'tfds' needs tensorflow_datasets: "
                        "pip install tensorflow-datasets, "
                        "then prepare the data once with network access") from None
    try:
        builder = tfds.builder(name, data_dir=data_dir)
        available = builder.info.splits
        if not builder.data_path or not tf.io.gfile.exists(os.fspath(builder.data_path)):
            raise FileNotFoundError(builder.data_path)
    except Exception as e:  # tfds raises many types for unknown or missing datasets
        raise DataError(f"TFDS dataset {name!r} is not prepared under "
                        f"{data_dir or '~/tensorflow_datasets'} "
                        f"({type(e).__name__}); run tfds.load({name!r}) once with network access"
                        ) from None
    size = tuple(int(s) for s in image_size)

    def make(split):
        if split not in available:
            return None
        ds = builder.as_dataset(split=split, as_supervised=True, shuffle_files=False)
        return ds.map(lambda x, y: (tf.image.resize(tf.image.convert_image_dtype(x, tf.float32),
                                                    size),
                                    tf.cast(y, tf.int64)), num_parallel_calls=tf.data.AUTOTUNE)

    label = builder.info.features["label"]
    channels = builder.info.features["image"].shape[-1]
    datasets = {s: make(s) for s in ("train", "validation", "test")}
    empty = tf.data.Dataset.from_tensor_slices((tf.zeros((0, *size, channels)),
                                                tf.zeros((0,), tf.int64)))
    info = DatasetInfo(name=f"tfds:{name}", input_shape=(*size, channels),
                       num_classes=label.num_classes,
                       class_names=tuple(label.names),
                       num_examples={s: available[s].num_examples if s in available else 0
                                     for s in datasets},
                       in_memory=False)
    return Splits(datasets["train"], datasets["validation"] or empty, datasets["test"] or empty,
                  info)
