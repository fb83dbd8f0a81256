"""Datasets and input pipelines.

`load_dataset` gives unbatched train/validation/test splits of a source;
`build_pipeline` (or `build_splits`) turns them into fast batches for `fit`;
`batch_dataset` is the plain shuffle-batch-prefetch kept for simple uses.
"""

from tfaccel.data.pipeline import (
    PipelineConfig,
    auto_shard_policy,
    build_pipeline,
    build_splits,
    pipeline_options,
    steps_per_epoch,
)
from tfaccel.data.sources import (
    DATASETS,
    DatasetInfo,
    Splits,
    batch_dataset,
    check_image_file,
    from_arrays,
    load_dataset,
    load_digits,
    load_image_dir,
    load_npz,
    load_synthetic,
)
from tfaccel.data.tfds import load_tfds
from tfaccel.data.tfrecord import (
    load_tfrecord,
    parse_feature_spec,
    scan_tfrecords,
    write_image_tfrecords,
)

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "PipelineConfig",
    "Splits",
    "auto_shard_policy",
    "batch_dataset",
    "build_pipeline",
    "build_splits",
    "check_image_file",
    "from_arrays",
    "load_dataset",
    "load_digits",
    "load_image_dir",
    "load_npz",
    "load_synthetic",
    "load_tfds",
    "load_tfrecord",
    "parse_feature_spec",
    "pipeline_options",
    "scan_tfrecords",
    "steps_per_epoch",
    "write_image_tfrecords",
]
