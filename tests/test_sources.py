"""tfaccel.data sources: image folders with bad files, TFRecord files with a feature spec, TFDS."""

import os

import numpy as np
import pytest
import tensorflow as tf

from tfaccel.data import (
    check_image_file,
    load_dataset,
    load_image_dir,
    load_npz,
    load_tfrecord,
    parse_feature_spec,
    write_image_tfrecords,
)
from tfaccel.errors import DataError
from tfaccel.summaries import read_text_summaries


def save_image(path, seed=0, fmt="JPEG", size=(20, 24)):
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, fmt)
    return path


def image_folder(root, per_class=6, bad=True):
    """Two classes of JPEGs and PNGs; with `bad`, one truncated JPEG and one text file."""
    for c, name in enumerate(("cats", "dogs")):
        for i in range(per_class):
            ext, fmt = (".png", "PNG") if i % 3 == 0 else (".jpg", "JPEG")
            save_image(os.path.join(root, name, f"{i}{ext}"), seed=10 * c + i, fmt=fmt)
    if bad:
        whole = open(save_image(os.path.join(root, "cats", "broken.jpg"), seed=99), "rb").read()
        with open(os.path.join(root, "cats", "broken.jpg"), "wb") as f:
            f.write(whole[: len(whole) // 2])
        with open(os.path.join(root, "dogs", "notes.txt"), "w") as f:
            f.write("not an image\n")
    return str(root)


def test_check_image_file(tmp_path):
    jpg = save_image(str(tmp_path / "a.jpg"))
    png = save_image(str(tmp_path / "b.png"), fmt="PNG")
    gif = save_image(str(tmp_path / "c.gif"), fmt="GIF")
    bmp = save_image(str(tmp_path / "d.bmp"), fmt="BMP")
    assert [check_image_file(p) for p in (jpg, png, gif, bmp)] == [None] * 4
    for path, expected in ((jpg, "truncated JPEG"), (png, "truncated PNG"), (bmp, "truncated BMP")):
        data = open(path, "rb").read()
        cut = str(tmp_path / ("cut-" + os.path.basename(path)))
        open(cut, "wb").write(data[: len(data) // 2])
        assert check_image_file(cut).startswith(expected)
    text = tmp_path / "t.jpg"
    text.write_text("hello")
    assert check_image_file(str(text)).startswith("not an image")


def test_image_folder_fail_names_the_bad_file(tmp_path):
    root = image_folder(tmp_path / "imgs")
    with pytest.raises(DataError,
                       match=r"bad image file .*(broken\.jpg|notes\.txt): .*--on_bad_example=skip"):
        load_image_dir(root, image_size=(16, 16))


def test_image_folder_skip_names_both_and_trains_on_the_rest(tmp_path, caplog):
    root = image_folder(tmp_path / "imgs")
    with caplog.at_level("WARNING", logger="tfaccel"):
        splits = load_image_dir(root, image_size=(16, 16), on_bad_example="skip",
                                test_fraction=0.25)
    bad = dict(splits.bad_files)
    assert sorted(os.path.basename(f) for f in bad) == ["broken.jpg", "notes.txt"]
    assert bad[os.path.join(root, "cats", "broken.jpg")].startswith("truncated JPEG")
    assert sum(splits.info.num_examples.values()) == 12
    warnings = [r.getMessage() for r in caplog.records if "bad image file" in r.getMessage()]
    assert len(warnings) == 1 and "broken.jpg" in warnings[0] and "notes.txt" in warnings[0]
    images = np.concatenate([x.numpy()[None] for x, _ in splits.train])
    assert images.shape[1:] == (16, 16, 3) and 0 <= images.min() and images.max() <= 1


def test_existing_sources_keep_their_behaviour():
    splits = load_dataset("digits")
    assert splits.info.num_examples == {"train": 1257, "validation": 180, "test": 360}
    assert splits.bad_files == () and splits.info.in_memory


@pytest.fixture
def records(tmp_path):
    images = np.random.default_rng(0).integers(0, 255, (40, 12, 12, 3), dtype=np.uint8)
    labels = np.arange(40) % 4
    files = write_image_tfrecords(str(tmp_path / "recs" / "data"), images, labels, num_shards=4)
    return str(tmp_path / "recs"), files, labels


def test_tfrecord_reads_every_record_once_over_consistent_splits(records):
    path, _, labels = records
    splits = load_tfrecord(path, image_size=(10, 10))
    counts = splits.info.num_examples
    assert sum(counts.values()) == 40 and min(counts.values()) > 0
    assert splits.info.num_classes == 4 and not splits.info.in_memory
    seen = []
    for name in ("train", "validation", "test"):
        ds = getattr(splits, name)
        first = sorted(int(y) for _, y in ds)
        assert first == sorted(int(y) for _, y in ds)  # every pass agrees on the split
        assert len(first) == counts[name]
        seen += first
    assert sorted(seen) == sorted(labels.tolist())
    x, _ = next(iter(splits.train))
    assert x.shape == (10, 10, 3) and x.dtype == tf.float32


def test_tfrecord_split_files_by_name(tmp_path):
    images = np.zeros((6, 8, 8, 3), np.uint8)
    write_image_tfrecords(str(tmp_path / "train"), images, [0, 1, 0, 1, 0, 1])
    write_image_tfrecords(str(tmp_path / "test"), images[:2], [0, 1])
    splits = load_tfrecord(str(tmp_path), image_size=(8, 8), validation_fraction=0)
    assert splits.info.num_examples == {"train": 6, "validation": 0, "test": 2}


@pytest.mark.parametrize("mode", ["fail", "skip"])
def test_truncated_tfrecord(records, mode):
    path, files, _ = records
    data = open(files[2], "rb").read()
    open(files[2], "wb").write(data[: len(data) * 2 // 3])
    if mode == "fail":
        with pytest.raises(DataError,
                           match=r"bad TFRecord .*data-00002-of-00004\.tfrecord: truncated"):
            load_tfrecord(path, image_size=(8, 8))
        return
    splits = load_tfrecord(path, image_size=(8, 8), on_bad_example="skip")
    (where, why), = splits.bad_files
    assert where == files[2] and why.startswith("truncated or corrupt after record")
    good = int(why.split("after record ")[1].split()[0])
    total = sum(sum(1 for _ in getattr(splits, s)) for s in ("train", "validation", "test"))
    assert total == 30 + good == sum(splits.info.num_examples.values())


@pytest.mark.parametrize("spec, message", [
    ("image=float[12,12,3],label=int64", "does not match the file, whose records have image:bytes"),
    ("image=bytes,label=float", "does not match the file"),
    ("image=bytes,klass=int64", "has no 'label' feature"),
])
def test_tfrecord_spec_that_does_not_match_is_one_clear_line(records, spec, message):
    with pytest.raises(DataError, match=message) as err:
        load_tfrecord(records[0], spec, image_size=(8, 8))
    assert "\n" not in str(err.value) and "function_node" not in str(err.value)


def test_feature_spec_parsing():
    spec = parse_feature_spec("image=float[8,8,1], label=int64")
    assert spec["image"].shape == [8, 8, 1] and spec["image"].dtype == tf.float32
    with pytest.raises(DataError, match="'image=jpeg' is not name=type"):
        parse_feature_spec("image=jpeg,label=int64")


def test_tfds_needs_the_package_or_prepared_data():
    try:
        import tensorflow_datasets  # noqa: F401
        expected = "is not prepared"
    except ImportError:
        expected = "needs tensorflow_datasets: pip install tensorflow-datasets"
    with pytest.raises(DataError, match=expected):
        load_dataset("tfds", "/nonexistent", tfds_name="mnist")
    with pytest.raises(DataError, match="--tfds_name"):
        load_dataset("tfds")


@pytest.mark.slow
def test_train_recipe_skips_or_stops_on_bad_image_files(recipe, tmp_path):
    root = image_folder(tmp_path / "imgs", per_class=10)
    common = ["--dataset=image_dir", f"--data_dir={root}", "--image_size=16,16", "--model=mlp",
              "--epochs=1", "--batch_size=8"]
    failed = recipe("train", *common, f"--model_dir={tmp_path / 'fail'}")
    assert failed.returncode == 2
    last = failed.stderr.strip().splitlines()[-1]
    assert (last.startswith("error: bad image file")
            and ("broken.jpg" in last or "notes.txt" in last))
    assert "Traceback" not in failed.stderr and not os.path.exists(tmp_path / "fail")

    skipped = recipe("train", *common, "--on_bad_example=skip", f"--model_dir={tmp_path / 'skip'}")
    assert skipped.returncode == 0, skipped.stderr[-2000:]
    named = [line for line in skipped.stderr.splitlines() if "bad image file" in line]
    assert len(named) == 1 and "broken.jpg" in named[0] and "notes.txt" in named[0]
    text = read_text_summaries(tmp_path / "skip" / "logs" / "train")["data/skipped_bad_files"]
    assert "broken.jpg" in text and "notes.txt" in text and "truncated JPEG" in text
    assert os.path.exists(tmp_path / "skip" / "metrics.json")


@pytest.mark.slow
def test_train_recipe_rejects_a_tfrecord_spec_that_does_not_match(recipe, records, tmp_path):
    result = recipe("train", "--dataset=tfrecord", f"--data_dir={records[0]}",
                    "--tfrecord_features=image=float[64],label=int64",
                    f"--model_dir={tmp_path / 'run'}")
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: TFRecord ") and "does not match the file" in last
    assert not os.path.exists(tmp_path / "run")


def test_npz_mistakes_are_named(tmp_path):
    strings = tmp_path / "strings.npz"
    np.savez(strings, x=np.zeros((20, 4, 4), np.uint8), y=np.array(["cat", "dog"] * 10))
    with pytest.raises(DataError, match=r"y holds <U3 labels such as 'cat', not class ids "
                       r"0\.\.N-1: map them to integers"):
        load_npz(str(strings))
    negative = tmp_path / "negative.npz"
    np.savez(negative, x=np.zeros((20, 4, 4), np.uint8), y=np.array([-1, 1] * 10))
    with pytest.raises(DataError, match="labels such as -1"):
        load_npz(str(negative))
    floats = tmp_path / "floats.npz"
    np.savez(floats, x=np.zeros((20, 4, 4), np.uint8), y=np.array([0.0, 1.0] * 10))
    assert load_npz(str(floats)).info.num_classes == 2  # whole-number floats are class ids
    text_x = tmp_path / "text_x.npz"
    np.savez(text_x, x=np.array([["a"]] * 20), y=np.array([0, 1] * 10))
    with pytest.raises(DataError, match="x holds <U1 values, not numbers"):
        load_npz(str(text_x))
    with pytest.raises(DataError, match="dataset 'npz' needs a file: pass --data_dir="):
        load_dataset("npz", None)
    with pytest.raises(DataError, match="is a folder, not a file"):
        load_npz(str(tmp_path))
    with pytest.raises(DataError, match=r"is a file, not a folder: .*read by --dataset=npz"):
        load_image_dir(str(strings))


def test_bad_image_error_says_hidden_files_are_ignored(tmp_path):
    root = image_folder(tmp_path / "imgs", bad=False)
    (tmp_path / "imgs" / "cats" / ".DS_Store").write_text("hidden, ignored")
    assert sum(load_image_dir(root, image_size=(8, 8)).info.num_examples.values()) == 12
    (tmp_path / "imgs" / "cats" / "notes.txt").write_text("not hidden")
    with pytest.raises(DataError, match=r"notes\.txt: not an image .*names starting with '\.' are "
                       "ignored.*--on_bad_example=skip"):
        load_image_dir(root, image_size=(8, 8))
