"""TFRecord files of images and labels: write them, check them, read them fast.

`load_tfrecord` reads ``tf.train.Example`` records with a feature spec (by default
``image=bytes,label=int64``: encoded JPEG/PNG and an integer class). Before any
training it scans the files once (`tfaccel.data.tfrecord_scan`: records are
read, not decoded): a spec that does not match the file, a truncated or corrupt
file and records that do not parse are found and named there. Reading is a
parallel interleave over files, then one parallel map that parses and decodes.

Example:

    import numpy as np
    from tfaccel.data import tfrecord

    images = np.random.randint(0, 255, (100, 32, 32, 3), np.uint8)
    files = tfrecord.write_image_tfrecords("/tmp/recs/train", images, np.arange(100) % 2)
    splits = tfrecord.load_tfrecord("/tmp/recs", image_size=(32, 32))
"""

import glob
import io
import logging
import os
import re

import numpy as np
import tensorflow as tf

from tfaccel.data import augment
from tfaccel.data.tfrecord_scan import (
    DEFAULT_FEATURES,
    parse_feature_spec,
    scan_tfrecords,
    spec_text,
)
from tfaccel.data.types import DatasetInfo, Splits
from tfaccel.errors import DataError

log = logging.getLogger("tfaccel")

_SPLIT_NAMES = {"train": "train", "validation": "validation", "valid": "validation",
                "val": "validation", "test": "test"}


def write_image_tfrecords(prefix, images, labels, num_shards=1, image_format="jpeg", quality=90):
    """Writes uint8 images (N, H, W, C) as encoded-image ``tf.train.Example`` records.

    Files are ``{prefix}-{i:05d}-of-{n:05d}.tfrecord``; each record holds ``image``
    (encoded bytes) and ``label`` (int64).

    Returns:
      The list of files written.
    """
    from PIL import Image  # deferred: Pillow, only to encode images

    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    files = [f"{prefix}-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]
    writers = [tf.io.TFRecordWriter(f) for f in files]
    for i, (image, label) in enumerate(zip(images, labels)):
        buf = io.BytesIO()
        Image.fromarray(np.asarray(image).squeeze()).save(
            buf, format=image_format.upper(),
            **({"quality": quality} if image_format == "jpeg" else {}))
        example = tf.train.Example(features=tf.train.Features(feature={
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[buf.getvalue()])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
        }))
        writers[i % num_shards].write(example.SerializeToString())
    for w in writers:
        w.close()
    return files


def list_tfrecords(path):
    """TFRecord files of a folder, a glob pattern, or one file, sorted."""
    if path and os.path.isdir(path):
        files = sorted(f for f in glob.glob(os.path.join(path, "*"))
                       if os.path.isfile(f) and not os.path.basename(f).startswith("."))
    else:
        files = sorted(glob.glob(path)) if path else []
    if not files:
        raise DataError(f"no TFRecord files at {path!r}: pass --data_dir=a folder, a glob like "
                        "/data/train-*.tfrecord, or one file")
    return files


def _split_of(path):
    for token in re.split(r"[^a-z]+", os.path.basename(path).lower()):
        if token in _SPLIT_NAMES:
            return _SPLIT_NAMES[token]
    return None


def _bucket(file_id, record_index):
    """A deterministic value in [0, 1000) per record: which held-out split it falls in."""
    return ((file_id * 1_000_003 + record_index) * 2_654_435_761) % 1000


def load_tfrecord(path, features=DEFAULT_FEATURES, *, image_key="image", label_key="label",
                  image_size=(64, 64), channels=3, on_bad_example="fail",
                  validation_fraction=0.1, test_fraction=0.2):
    """`Splits` from TFRecord files of ``tf.train.Example`` (image, label).

    Files whose names contain ``train``, ``validation``/``val``/``valid`` or ``test`` form
    those splits; a split with no files is cut from the train files, record by record
    (a fixed hash of file and record index, so every pass agrees).

    Args:
      path: a folder, a glob pattern or one file.
      features: a feature spec dict, or text like ``"image=bytes,label=int64"``.
      image_key, label_key: the features holding the image and the integer label.
      image_size, channels: encoded images are decoded and resized to this.
      on_bad_example: 'fail' raises on a corrupt file or record; 'skip' reads around them
        and names them in `Splits.bad_files`.
      validation_fraction, test_fraction: shares cut from train when those files are missing.

    Raises:
      DataError: no files, a spec that does not match the files, a missing key, or (with
        'fail') a corrupt file or record.
    """
    spec = parse_feature_spec(features) if isinstance(features, str) else dict(features)
    for key in (image_key, label_key):
        if key not in spec:
            raise DataError(f"feature spec {spec_text(spec)} has no {key!r} feature: add it or "
                            "set the image/label key")
    files = list_tfrecords(path)
    scan = scan_tfrecords(files, spec, label_key)
    if scan.bad and on_bad_example == "fail":
        where, why = scan.bad[0]
        raise DataError(f"bad TFRecord {where}: {why}; fix or remove it, "
                        "or pass --on_bad_example=skip")
    for where, why in scan.bad:
        log.warning("skipping bad TFRecord data %s: %s", where, why)
    all_labels = np.concatenate(scan.labels) if scan.labels else np.zeros(0, np.int64)
    if all_labels.size == 0:
        raise DataError(f"TFRecord files at {path!r} hold no readable records")
    if all_labels.min() < 0:
        raise DataError(f"TFRecord label {label_key!r} has negative values; "
                        "labels must be class ids 0..N-1")
    num_classes = max(2, int(all_labels.max()) + 1)

    by_split = {s: [i for i, f in enumerate(files) if _split_of(f) == s]
                for s in ("train", "validation", "test")}
    if not any(by_split.values()):
        by_split["train"] = list(range(len(files)))
    cuts = {}
    if not by_split["validation"] and validation_fraction > 0:
        cuts["validation"] = (0, validation_fraction)
    if not by_split["test"] and test_fraction > 0:
        cuts["test"] = (validation_fraction if "validation" in cuts else 0,
                        validation_fraction * ("validation" in cuts) + test_fraction)
    train_ranges = list(cuts.values())
    image_feature = spec[image_key]
    size = tuple(int(s) for s in image_size)

    def parse(record):
        parsed = tf.io.parse_single_example(record, spec)
        image, label = parsed[image_key], tf.reshape(parsed[label_key], [])
        if image_feature.dtype == tf.string:
            image = augment.decode(image, size, channels)
        else:
            image = tf.cast(image, tf.float32)
        return image, label

    def make(file_ids, keep=None, drop=()):
        if not file_ids:
            return tf.data.Dataset.from_tensor_slices(
                (tf.zeros((0, *input_shape)), tf.zeros((0,), tf.int64)))
        ids = np.asarray(file_ids)
        names = np.asarray(files)[ids]
        counts = np.asarray(scan.counts, np.int64)[ids]

        def read(name, file_id, count):
            ds = tf.data.TFRecordDataset(name).take(count)
            if keep is None and not drop:
                return ds
            ds = ds.enumerate()

            def wanted(index, _):
                b = _bucket(tf.cast(file_id, tf.int64), index)
                if keep is not None:
                    return (b >= int(keep[0] * 1000)) & (b < int(keep[1] * 1000))
                out = tf.constant(True)
                for lo, hi in drop:
                    out &= ~((b >= int(lo * 1000)) & (b < int(hi * 1000)))
                return out

            return ds.filter(wanted).map(lambda _, r: r)

        ds = tf.data.Dataset.from_tensor_slices((names, ids.astype(np.int64), counts))
        ds = ds.interleave(read, num_parallel_calls=tf.data.AUTOTUNE)
        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.ignore_errors(log_warning=True) if on_bad_example == "skip" else ds

    input_shape = ((*size, channels) if image_feature.dtype == tf.string
                   else tuple(image_feature.shape))

    def count(file_ids, keep=None, drop=()):
        total = 0
        for i in file_ids:
            b = _bucket(i, np.arange(scan.counts[i], dtype=np.int64))
            mask = np.ones_like(b, bool)
            if keep is not None:
                mask = (b >= int(keep[0] * 1000)) & (b < int(keep[1] * 1000))
            for lo, hi in drop:
                mask &= ~((b >= int(lo * 1000)) & (b < int(hi * 1000)))
            total += int(mask.sum())
        return total

    datasets, sizes = {}, {}
    datasets["train"] = make(by_split["train"], drop=train_ranges)
    sizes["train"] = count(by_split["train"], drop=train_ranges)
    for split in ("validation", "test"):
        if split in cuts:
            datasets[split] = make(by_split["train"], keep=cuts[split])
            sizes[split] = count(by_split["train"], keep=cuts[split])
        else:
            datasets[split] = make(by_split[split])
            sizes[split] = count(by_split[split])

    info = DatasetInfo(name="tfrecord", input_shape=input_shape, num_classes=num_classes,
                       class_names=tuple(str(i) for i in range(num_classes)),
                       num_examples=sizes, in_memory=False)
    split_files = {s: [files[i] for i in (by_split["train"] if s in cuts else by_split[s])]
                   for s in ("train", "validation", "test")}
    return Splits(datasets["train"], datasets["validation"], datasets["test"], info,
                  files=split_files, bad_files=tuple(scan.bad))
