"""Where examples come from: digits, synthetic, image folders, NumPy files.

Every loader returns a `Splits`: unbatched `tf.data.Dataset`s of
``(image, label)`` for train, validation and test, plus a `DatasetInfo` with
the input shape and classes. Labels are integer class ids. Nothing downloads:
`digits` is scikit-learn's bundled copy of the UCI handwritten digits.

Example:

    from tfaccel.data import load_dataset

    splits = load_dataset("digits")
    print(splits.info.input_shape, splits.info.num_classes)   # (8, 8, 1) 10
"""

import os

import numpy as np
import tensorflow as tf

from tfaccel.choices import DATASETS
from tfaccel.data import augment
from tfaccel.data.bad_files import drop_bad_files
from tfaccel.data.tfds import load_tfds
from tfaccel.data.tfrecord import load_tfrecord
from tfaccel.data.types import DatasetInfo, Splits
from tfaccel.errors import DataError, first_line

# The digits split is fixed (not seeded by the run) so that every run, preset
# and report is scored on the same 360 test images.
_DIGITS_SPLIT_SEED = 0


def _split_indices(labels, validation_fraction, test_fraction, seed):
    """Stratified train/validation/test index arrays."""
    if test_fraction <= 0 or validation_fraction < 0 or validation_fraction + test_fraction >= 1:
        raise DataError(
            f"validation_fraction={validation_fraction} and test_fraction={test_fraction} "
            "must be >= 0 and > 0 respectively and sum to less than 1"
        )
    rest, (test, _) = _cut(np.arange(len(labels)), labels, test_fraction, seed)
    if validation_fraction == 0:
        return rest[0], rest[0][:0], test
    (train, _), (val, _) = _cut(*rest, validation_fraction / (1 - test_fraction), seed)
    return train, val, test


def from_arrays(name, x, y, *, validation_fraction=0.1, test_fraction=0.2, seed=0,
                class_names=None, splits=None):
    """Builds `Splits` from in-memory arrays.

    Args:
      name: dataset name for reports.
      x: float array of examples, first axis the example index.
      y: integer labels.
      validation_fraction, test_fraction: shares of a stratified split.
      seed: seed of that split.
      class_names: optional names of the classes.
      splits: optional dict {'train': (x, y), 'validation': (x, y), 'test': (x, y)}
        used as is instead of splitting `x`, `y`.
    """
    if splits is None:
        y = np.asarray(y).astype(np.int64)
        train, val, test = _split_indices(y, validation_fraction, test_fraction, seed)
        splits = {"train": (x[train], y[train]), "validation": (x[val], y[val]),
                  "test": (x[test], y[test])}
    all_labels = np.concatenate([np.asarray(v[1]).reshape(-1) for v in splits.values()])
    num_classes = int(all_labels.max()) + 1 if all_labels.size else 0
    datasets = {
        key: tf.data.Dataset.from_tensor_slices(
            (np.asarray(xs, np.float32), np.asarray(ys, np.int64)))
        for key, (xs, ys) in splits.items()
    }
    info = DatasetInfo(
        name=name,
        input_shape=tuple(int(d) for d in np.asarray(splits["train"][0]).shape[1:]),
        num_classes=num_classes,
        class_names=tuple(class_names or (str(i) for i in range(num_classes))),
        num_examples={k: int(len(v[1])) for k, v in splits.items()},
        in_memory=True,
    )
    return Splits(datasets["train"], datasets["validation"], datasets["test"], info)


def load_digits() -> Splits:
    """scikit-learn's bundled 8x8 digits (1,797 images), scaled to [0, 1].

    The stratified split is fixed: 1,257 train, 180 validation, 360 test.
    """
    # deferred: scikit-learn, only for the digits
    from sklearn.datasets import load_digits as _sk_digits

    bunch = _sk_digits()
    x = (bunch.images.astype(np.float32) / 16.0)[..., np.newaxis]
    return from_arrays("digits", x, bunch.target, validation_fraction=0.1,
                       test_fraction=0.2, seed=_DIGITS_SPLIT_SEED)


def load_synthetic(input_shape=(8, 8, 1), num_classes=10, num_examples=1024, seed=0) -> Splits:
    """Generated examples of any shape and class count, for throughput work.

    Examples are made lazily inside tf.data (no big arrays in memory), the same
    for the same seed. Each class shifts the mean of Gaussian noise, so a model
    can learn them: accuracy moves, unlike with pure noise.

    Args:
      input_shape: shape of one example, e.g. (224, 224, 3) or (784,).
      num_classes: number of classes (>= 2).
      num_examples: training examples; validation and test get a tenth each.
      seed: makes the examples reproducible.
    """
    shape = tuple(int(d) for d in input_shape)
    if not shape or any(d <= 0 for d in shape):
        raise DataError(f"synthetic input_shape={input_shape} must be positive sizes, e.g. 32,32,3")
    if num_classes < 2:
        raise DataError(f"synthetic num_classes={num_classes} must be at least 2")
    if num_examples < 1:
        raise DataError(f"synthetic num_examples={num_examples} must be at least 1")

    def make(count, split_seed):
        def example(i):
            label = i % num_classes
            noise = tf.random.stateless_normal(shape, seed=tf.stack([split_seed, i]))
            offset = 2.0 * tf.cast(label, tf.float32) / float(num_classes - 1) - 1.0
            return 0.5 * noise + offset, label

        return tf.data.Dataset.range(count).map(example, num_parallel_calls=tf.data.AUTOTUNE)

    held_out = max(1, num_examples // 10)
    info = DatasetInfo(
        name="synthetic",
        input_shape=shape,
        num_classes=num_classes,
        class_names=tuple(str(i) for i in range(num_classes)),
        num_examples={"train": num_examples, "validation": held_out, "test": held_out},
        in_memory=True,
    )
    return Splits(make(num_examples, 3 * seed), make(held_out, 3 * seed + 1),
                  make(held_out, 3 * seed + 2), info)


def list_image_dir(path):
    """Returns (files, labels, class_names) of a folder of class subfolders."""
    if not path:
        raise DataError("image_dir needs a folder: "
                        "pass --data_dir=/path/with/one/subfolder/per/class")
    if os.path.isfile(path):
        raise DataError(f"image folder {path!r} is a file, not a folder: pass a folder with one "
                        "subfolder per class" + (" (an .npz file is read by --dataset=npz)"
                                                 if path.endswith(".npz") else ""))
    if not os.path.isdir(path):
        raise DataError(f"image folder {path!r} does not exist: pass a folder with one "
                        "subfolder per class")
    class_names = sorted(
        d for d in os.listdir(path)
        if os.path.isdir(os.path.join(path, d)) and not d.startswith(".")
    )
    if len(class_names) < 2:
        raise DataError(
            f"image folder {path!r} has {len(class_names)} class subfolder(s): "
            "it needs one subfolder per class, at least two"
        )
    files, labels = [], []
    for label, name in enumerate(class_names):
        folder = os.path.join(path, name)
        for root, _, names in sorted(os.walk(folder)):
            for fname in sorted(names):
                if not fname.startswith("."):
                    files.append(os.path.join(root, fname))
                    labels.append(label)
    if not files:
        raise DataError(f"image folder {path!r} has class subfolders but no files in them")
    return files, np.asarray(labels, np.int64), tuple(class_names)


def decode_image(path, image_size, channels):
    """Reads, decodes and resizes one image file to float32 in [0, 1]."""
    return augment.decode(tf.io.read_file(path), tuple(image_size), channels)


def load_image_dir(path, image_size=(64, 64), channels=3, validation_fraction=0.1,
                   test_fraction=0.2, seed=0, on_bad_example="fail") -> Splits:
    """A folder with one subfolder of images per class (JPEG, PNG, GIF, BMP).

    Every file is checked first (`check_image_file`: signature and end marker, no
    decoding). With ``on_bad_example='fail'`` the first bad file raises; with
    'skip' bad files are left out, logged once and listed in `Splits.bad_files`
    (and any image that still fails to decode is dropped by the pipeline).
    Files are split (stratified, seeded) before decoding; decoding and resizing
    run in parallel inside tf.data. Images come out float32 in [0, 1].

    Raises:
      DataError: a missing folder, fewer than two classes, or (with 'fail') a bad file.
    """
    files, labels, class_names = list_image_dir(path)
    files, labels, bad = drop_bad_files(files, labels, on_bad_example)
    if len(files) == 0:
        raise DataError(f"image folder {path!r} has no readable images")
    size = tuple(int(s) for s in image_size)
    train, val, test = _split_indices(labels, validation_fraction, test_fraction, seed)
    files = np.asarray(files)

    def make(index):
        ds = tf.data.Dataset.from_tensor_slices((files[index], labels[index]))
        return ds.map(lambda f, y: (decode_image(f, size, channels), y),
                      num_parallel_calls=tf.data.AUTOTUNE)

    info = DatasetInfo(
        name="image_dir",
        input_shape=(*size, channels),
        num_classes=len(class_names),
        class_names=class_names,
        num_examples={"train": len(train), "validation": len(val), "test": len(test)},
        in_memory=False,
    )
    split_files = {"train": list(files[train]), "validation": list(files[val]),
                   "test": list(files[test])}
    return Splits(make(train), make(val), make(test), info, files=split_files, bad_files=bad)


def load_npz(path, validation_fraction=0.1, test_fraction=0.2, seed=0) -> Splits:
    """NumPy arrays in an .npz file.

    Either ``x_train, y_train`` (with optional ``x_val, y_val`` and
    ``x_test, y_test``; missing splits are cut from train) or plain ``x, y``.
    Integer images (uint8) are scaled to [0, 1]; (N, H, W) gets a channel axis.
    """
    holding = "holding x_train, y_train (and optionally x_val, y_val, x_test, y_test) or x, y"
    if not path:
        raise DataError(f"dataset 'npz' needs a file: pass --data_dir=/path/to/data.npz {holding}")
    if os.path.isdir(path):
        raise DataError(f"npz file {path!r} is a folder, not a file: pass --data_dir=/path/to/"
                        f"data.npz {holding}" + ("" if any(n.endswith(".npz") for n in os.listdir(
                            path)) else " (a folder of class subfolders is --dataset=image_dir)"))
    if not os.path.isfile(path):
        raise DataError(f"npz file {path!r} does not exist: pass --data_dir=/path/to/data.npz "
                        + holding)
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as e:  # zipfile/pickle errors come in many types
        raise DataError(f"npz file {path!r} cannot be read ({first_line(e, with_type=True)}); "
                        "save it with numpy.savez") from None

    def prep(x, key):
        x = np.asarray(x)
        if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
            raise DataError(f"npz file {path!r}: {key} holds {x.dtype} values, not numbers: save "
                            "the examples as a numeric array (e.g. uint8 or float32 images)")
        if np.issubdtype(x.dtype, np.integer):
            x = x.astype(np.float32) / float(np.iinfo(x.dtype).max)
        if x.ndim == 3:
            x = x[..., np.newaxis]
        return x.astype(np.float32)

    def pair(xk, yk):
        if xk in arrays and yk in arrays:
            x, y = prep(arrays[xk], xk), class_ids(arrays[yk], yk)
            if len(x) != len(y):
                raise DataError(f"npz file {path!r}: {xk} has {len(x)} rows but {yk} has {len(y)}")
            return x, y
        return None

    def class_ids(y, key):
        y = np.asarray(y).reshape(-1)
        if np.issubdtype(y.dtype, np.number):
            as_float = y.astype(np.float64)
            bad = y[~(np.isfinite(as_float) & (as_float >= 0) & (as_float == np.round(as_float)))]
        else:
            bad = y
        if bad.size:
            raise DataError(f"npz file {path!r}: {key} holds {y.dtype} labels such as "
                            f"{bad[0].item()!r}, not class ids 0..N-1: map them to integers "
                            "(e.g. names, y = np.unique(y, return_inverse=True)) and save again")
        return y.astype(np.int64)

    train = pair("x_train", "y_train")
    if train is not None:
        val = pair("x_val", "y_val") or pair("x_validation", "y_validation")
        test = pair("x_test", "y_test")
        if test is None:
            train, test = _cut(*train, test_fraction, seed)
        if val is None:
            train, val = _cut(*train, validation_fraction, seed)
        return from_arrays("npz", None, None,
                           splits={"train": train, "validation": val, "test": test})
    both = pair("x", "y")
    if both is None:
        raise DataError(f"npz file {path!r} has arrays {sorted(arrays)}; "
                        "it needs x_train and y_train "
                        "(optionally x_val, y_val, x_test, y_test) or x and y")
    return from_arrays("npz", *both, validation_fraction=validation_fraction,
                       test_fraction=test_fraction, seed=seed)


def _cut(x, y, fraction, seed):
    """Splits `fraction` of (x, y) off, stratified: returns ((x, y) rest, (x, y) cut)."""
    from sklearn.model_selection import train_test_split  # deferred: scikit-learn

    stratify = y if np.min(np.bincount(y)) >= 2 else None
    rest, cut = train_test_split(np.arange(len(y)), test_size=fraction, random_state=seed,
                                 stratify=stratify)
    rest, cut = np.sort(rest), np.sort(cut)
    return (x[rest], y[rest]), (x[cut], y[cut])


def load_dataset(name, data_dir=None, *, image_size=(64, 64), input_shape=(8, 8, 1),
                 num_classes=10, num_examples=1024, seed=0, on_bad_example="fail",
                 features="image=bytes,label=int64", tfds_name=None) -> Splits:
    """Loads a dataset by name: one of `DATASETS`.

    Args:
      name: 'digits', 'synthetic', 'image_dir', 'npz', 'tfrecord' or 'tfds'.
      data_dir: the folder (image_dir), file (npz), folder/glob/file (tfrecord) or
        TFDS data folder (tfds).
      image_size: (height, width) images from files are resized to.
      input_shape, num_classes, num_examples: shape of the synthetic data.
      seed: seed of synthetic data and of file splits.
      on_bad_example: 'fail' or 'skip' bad image files / TFRecords.
      features: TFRecord feature spec, e.g. ``"image=bytes,label=int64"``.
      tfds_name: the TFDS dataset name (tfds).

    Raises:
      DataError: unknown name, or missing or unusable files.
    """
    if name == "digits":
        return load_digits()
    if name == "synthetic":
        return load_synthetic(input_shape, num_classes, num_examples, seed)
    if name == "image_dir":
        return load_image_dir(data_dir, image_size=image_size, seed=seed,
                              on_bad_example=on_bad_example)
    if name == "npz":
        return load_npz(data_dir, seed=seed)
    if name == "tfrecord":
        return load_tfrecord(data_dir, features, image_size=image_size,
                             on_bad_example=on_bad_example)
    if name == "tfds":
        if not tfds_name:
            raise DataError("dataset 'tfds' needs a dataset name: "
                            "pass --tfds_name=mnist (or name:version)")
        return load_tfds(tfds_name, data_dir, image_size=image_size)
    raise DataError(f"unknown dataset {name!r}: use one of {', '.join(DATASETS)}")

