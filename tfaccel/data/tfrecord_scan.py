"""TFRecord feature specs, and the scan that checks TFRecord files before any training.

`parse_feature_spec` turns ``"image=bytes,label=int64"`` into a
``tf.io.parse_single_example`` spec; `scan_tfrecords` reads every record once
(no decoding) and finds a spec that does not match the files, truncated or
corrupt files and records that do not parse, naming each.

Example:

    from tfaccel.data import tfrecord_scan

    spec = tfrecord_scan.parse_feature_spec("image=bytes,label=int64")
    scan = tfrecord_scan.scan_tfrecords(["/tmp/recs/train-00000-of-00001.tfrecord"], spec)
    scan.counts, scan.bad       # good records per file; (where, why) of the bad ones
"""

import dataclasses
import re

import numpy as np
import tensorflow as tf

from tfaccel.errors import DataError, first_line

DEFAULT_FEATURES = "image=bytes,label=int64"
_TYPES = {"bytes": tf.string, "string": tf.string, "int64": tf.int64, "int": tf.int64,
          "float": tf.float32, "float32": tf.float32}
_SCAN_BATCH = 512


def parse_feature_spec(text):
    """``"image=bytes,label=int64"`` or ``"image=float[8,8,1],label=int64"`` to a feature spec dict.

    Raises:
      DataError: a malformed entry or an unknown type.
    """
    spec = {}
    for item in filter(None, (s.strip() for s in re.split(r",(?![^\[]*\])", text or ""))):
        m = re.fullmatch(r"(\w+)\s*=\s*(\w+)\s*(?:\[([\d,\s]*)\])?", item)
        if not m or m.group(2) not in _TYPES:
            raise DataError(f"feature spec entry {item!r} is not name=type[shape] with type one of "
                            f"{', '.join(_TYPES)}, e.g. {DEFAULT_FEATURES}")
        shape = [int(d) for d in m.group(3).split(",") if d.strip()] if m.group(3) else []
        spec[m.group(1)] = tf.io.FixedLenFeature(shape, _TYPES[m.group(2)])
    if not spec:
        raise DataError(f"empty feature spec {text!r}: give e.g. {DEFAULT_FEATURES}")
    return spec


def describe_record(record):
    """The features of one serialized ``tf.train.Example`` as ``name:type[length]`` text."""
    example = tf.train.Example.FromString(record)
    parts = []
    for name, feature in sorted(example.features.feature.items()):
        kind = feature.WhichOneof("kind")
        length = len(getattr(feature, kind).value) if kind else 0
        parts.append(f"{name}:{(kind or 'empty').replace('_list', '')}[{length}]")
    return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class TFRecordScan:
    """What one pass over TFRecord files found."""

    counts: tuple
    """Good records at the start of each file (reading stops at a corrupt record)."""
    labels: tuple
    """Integer labels of each file's good, parseable records (one array per file)."""
    bad: tuple
    """(file or file#record, reason) of everything that could not be read or parsed."""


def _parse_error_text(error):
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", first_line(error, limit=1000))
    return re.sub(r"\s*\[Op:\w+\].*$", "", text)[:200]


def scan_tfrecords(files, features, label_key="label"):
    """Reads every record once (no decoding) and checks it against `features`.

    Raises:
      DataError: the first record of a file does not match `features` (the spec is
        wrong rather than a record), naming the features the file does have.
    """
    counts, labels, bad = [], [], []
    for path in files:
        good, file_labels = 0, []
        try:
            first = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
        except tf.errors.OpError:
            first = None  # unreadable from the start: reported by the scan below
        if first is not None:
            try:
                tf.io.parse_single_example(first, features)
            except (tf.errors.InvalidArgumentError, ValueError) as e:
                raise DataError(
                    f"TFRecord {path}: the feature spec {spec_text(features)} does not match the "
                    f"file, whose records have {describe_record(first.numpy())} "
                    f"({_parse_error_text(e)}); pass a matching spec") from None
        batches = iter(tf.data.TFRecordDataset(path).batch(_SCAN_BATCH))
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except tf.errors.OpError as e:
                # Find the last good record one by one, from the start of the failed batch.
                for record in _single_records(path, good):
                    if isinstance(record, Exception):
                        bad.append((path, f"truncated or corrupt after record {good} "
                                          f"({_parse_error_text(e)})"))
                        break
                    good += 1
                    file_labels.extend(_parse_labels([record], features, label_key, path,
                                                     good - 1, bad))
                break
            good += int(batch.shape[0])
            file_labels.extend(_parse_labels(batch, features, label_key, path,
                                             good - int(batch.shape[0]), bad))
        counts.append(good)
        labels.append(np.asarray(file_labels, np.int64))
    return TFRecordScan(tuple(counts), tuple(labels), tuple(bad))


def _single_records(path, start):
    it = iter(tf.data.TFRecordDataset(path).skip(start))
    while True:
        try:
            yield next(it)
        except StopIteration:
            return
        except tf.errors.OpError as e:
            yield e
            return


def _parse_labels(records, features, label_key, path, first_index, bad):
    try:
        parsed = tf.io.parse_example(tf.stack(records) if isinstance(records, list) else records,
                                     features)
        return list(np.asarray(parsed[label_key]).reshape(len(parsed[label_key]), -1)[:, 0])
    except tf.errors.InvalidArgumentError:
        out = []
        for i, record in enumerate(records):
            try:
                out.append(int(np.asarray(
                    tf.io.parse_single_example(record, features)[label_key]).reshape(-1)[0]))
            except (tf.errors.InvalidArgumentError, IndexError) as e:
                bad.append((f"{path}#{first_index + i}",
                            f"record does not parse ({_parse_error_text(e)})"))
        return out


def spec_text(features):
    """A feature spec dict back as the text `parse_feature_spec` reads, for messages."""
    def one(f):
        kind = {tf.string: "bytes", tf.int64: "int64", tf.float32: "float"}[f.dtype]
        return kind + (f"[{','.join(map(str, f.shape))}]" if f.shape else "")
    return ",".join(f"{k}={one(v)}" for k, v in features.items())
