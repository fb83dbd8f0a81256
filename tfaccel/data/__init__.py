"""Datasets and input pipelines.

`load_dataset` gives unbatched train/validation/test splits of a source;
`build_pipeline` (or `build_splits`) turns them into fast batches for `fit`;
`batch_dataset` is the same builder doing only shuffle-batch-prefetch, for simple uses.
`DatasetInfo` and `Splits` (in `types`) are what every source returns.
`text` is the language models' side: a corpus, its vocabulary, next-token windows.
"""

from tfaccel.data.bad_files import check_image_file
from tfaccel.data.pipeline import batch_dataset, build_pipeline, build_splits, steps_per_epoch
from tfaccel.data.pipeline_config import PipelineConfig, auto_shard_policy, pipeline_options
from tfaccel.data.sources import (
    DATASETS,
    from_arrays,
    load_dataset,
    load_digits,
    load_image_dir,
    load_npz,
    load_synthetic,
)
from tfaccel.data.text import (
    TextSplits,
    Vocabulary,
    build_vocabulary,
    load_text_dataset,
    load_vocabulary,
    read_corpus,
    read_text,  # deprecated: read_corpus
    text_dataset,
)
from tfaccel.data.tfds import load_tfds
from tfaccel.data.tfrecord import load_tfrecord, write_image_tfrecords
from tfaccel.data.tfrecord_scan import parse_feature_spec, scan_tfrecords
from tfaccel.data.types import DatasetInfo, Splits

__all__ = [
    "DATASETS",
    "DatasetInfo",
    "PipelineConfig",
    "Splits",
    "TextSplits",
    "Vocabulary",
    "auto_shard_policy",
    "batch_dataset",
    "build_pipeline",
    "build_splits",
    "build_vocabulary",
    "check_image_file",
    "from_arrays",
    "load_dataset",
    "load_digits",
    "load_image_dir",
    "load_npz",
    "load_synthetic",
    "load_text_dataset",
    "load_vocabulary",
    "load_tfds",
    "load_tfrecord",
    "parse_feature_spec",
    "pipeline_options",
    "read_corpus",
    "read_text",
    "scan_tfrecords",
    "steps_per_epoch",
    "text_dataset",
    "write_image_tfrecords",
]
