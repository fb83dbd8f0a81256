"""Datasets and input pipelines.

`load_dataset` gives unbatched train/validation/test splits of a source;
`batch_dataset` turns one into batches for `fit`.
"""

from tfaccel.data.sources import (
    DATASETS,
    DatasetInfo,
    Splits,
    batch_dataset,
    from_arrays,
    load_dataset,
    load_digits,
    load_image_dir,
    load_npz,
    load_synthetic,
)

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "Splits",
    "batch_dataset",
    "from_arrays",
    "load_dataset",
    "load_digits",
    "load_image_dir",
    "load_npz",
    "load_synthetic",
]
