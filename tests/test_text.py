"""Text data for language models: corpus, vocabularies, splits by position, window pipelines."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tfaccel.data import text
from tfaccel.errors import ConfigError, DataError


def one_line_error(kind, call, *args, **kwargs):
    with pytest.raises(kind) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message, message
    return message


def passes(dataset, epoch=None, epochs=(0,)):
    """The window starts of `dataset` (built on np.arange tokens) per pass, by batch order."""
    out = []
    for k in epochs:
        if epoch is not None:
            epoch.assign(k)
        out.append(np.concatenate([x[:, 0] for x, _ in dataset.as_numpy_iterator()]))
    return out


# --- the corpus and the split

def test_default_corpus_is_the_stdlib_topics_in_key_order():
    from pydoc_data.topics import topics

    corpus, source = text.read_corpus()
    assert source == "pydoc_data.topics" == text.DEFAULT_CORPUS
    assert len(corpus) == 465_048 and len(set(corpus)) == 103
    keys = sorted(topics)
    assert corpus.startswith(topics[keys[0]] + "\n" + topics[keys[1]])
    assert corpus.endswith("\n" + topics[keys[-1]])


def test_char_split_is_by_position_with_a_vocabulary_of_the_training_part():
    corpus, _ = text.read_corpus()
    splits = text.load_text_dataset(sequence_length=64)
    vocab = splits.vocab
    assert vocab.kind == "char" and vocab.size == 104 and len(vocab.symbols) == 103
    assert list(vocab.symbols) == sorted(set(corpus))
    n = splits.num_characters
    assert n == len(corpus) == len(splits.train) + len(splits.validation)
    assert len(splits.validation) == round(0.1 * n)  # the last 10%
    assert splits.train.dtype == splits.validation.dtype == np.int32
    whole = vocab.encode(corpus)
    np.testing.assert_array_equal(splits.train, whole[:len(splits.train)])
    np.testing.assert_array_equal(splits.validation, whole[len(splits.train):])
    assert vocab.decode(splits.train) + vocab.decode(splits.validation) == corpus


def test_byte_split_covers_the_utf8_bytes_of_the_text():
    corpus, _ = text.read_corpus()
    splits = text.load_text_dataset(tokenizer="byte")
    assert splits.vocab.size == 256 and splits.vocab.symbols == ()
    joined = np.concatenate([splits.train, splits.validation])
    assert bytes(joined.astype(np.uint8)) == corpus.encode("utf-8")
    assert len(joined) > splits.num_characters  # the corpus holds non-ASCII characters
    # cut between characters: the validation part decodes on its own
    assert splits.vocab.decode(splits.train) + splits.vocab.decode(splits.validation) == corpus


def test_validation_characters_unseen_in_training_are_unknown(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("ab" * 54 + "z" * 12)  # 120 characters: the last 12 are validation
    splits = text.load_text_dataset(path, sequence_length=8)
    assert splits.vocab.symbols == ("a", "b")
    np.testing.assert_array_equal(splits.validation, np.zeros(12, np.int32))
    assert splits.vocab.decode(splits.validation) == text.UNKNOWN * 12


# --- vocabularies

def test_char_and_byte_round_trips():
    sample = "Grüße, 世界 — ok\n\t🙂"
    char = text.build_vocabulary(sample)
    ids = char.encode(sample)
    assert ids.dtype == np.int32 and ids.min() >= 1 and ids.max() == char.size - 1
    assert char.decode(ids) == sample
    byte = text.build_vocabulary("anything", kind="byte")
    ids = byte.encode(sample)
    assert list(ids) == list(sample.encode("utf-8")) and ids.dtype == np.int32
    assert byte.decode(ids) == sample
    assert byte.decode([0xE4, 0xB8]) == "\ufffd"  # a cut multi-byte character
    assert char.encode("").shape == (0,) and char.decode([]) == ""


def test_unknown_characters_are_named_or_replaced():
    vocab = text.build_vocabulary("abc")
    message = one_line_error(DataError, vocab.encode, "abxyc\nz")
    assert "'\\n', 'x', 'y', 'z':" in message, message  # sorted, quoted on one line
    assert "4 characters" in message and "--tokenizer=byte" in message
    many = one_line_error(DataError, vocab.encode, "".join(chr(0x400 + i) for i in range(15)))
    assert "15 characters" in many and "and 5 more" in many
    assert many.count("'") == 2 * 10
    np.testing.assert_array_equal(vocab.encode("axb" + text.UNKNOWN, unknown="replace"),
                                  [1, 0, 2, 0])
    np.testing.assert_array_equal(vocab.encode(text.UNKNOWN), [0])  # id 0 is a known symbol
    one_line_error(ConfigError, vocab.encode, "a", unknown="skip")
    assert "outside" in one_line_error(DataError, vocab.decode, [1, vocab.size])


@pytest.mark.parametrize("kind", text.TOKENIZERS)
def test_vocabulary_saves_as_json_and_loads_back(tmp_path, kind):
    vocab = text.build_vocabulary("héllo wörld", kind)
    path = tmp_path / "vocabulary.json"
    assert vocab.save(path) == path
    saved = json.loads(path.read_text())
    assert saved["kind"] == kind and saved["size"] == vocab.size
    assert saved["symbols"] == list(vocab.symbols)
    loaded = text.load_vocabulary(path)
    assert loaded == vocab and loaded.encode("wörld").tolist() == vocab.encode("wörld").tolist()
    assert os.listdir(tmp_path) == ["vocabulary.json"]  # no temporary file left


def test_a_failed_save_keeps_the_old_vocabulary(tmp_path, monkeypatch):
    path = tmp_path / "vocabulary.json"
    text.build_vocabulary("abc").save(path)
    before = path.read_text()

    def crash(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        text.build_vocabulary("xyz").save(path)
    assert path.read_text() == before and os.listdir(tmp_path) == ["vocabulary.json"]


def test_bad_vocabulary_files(tmp_path):
    assert "no vocabulary" in one_line_error(DataError, text.load_vocabulary, tmp_path / "no")
    (tmp_path / "bad.json").write_text("{not json")
    one_line_error(DataError, text.load_vocabulary, tmp_path / "bad.json")
    (tmp_path / "cut.json").write_text(json.dumps({"kind": "char", "symbols": ["a"], "size": 9}))
    assert "size 9" in one_line_error(DataError, text.load_vocabulary, tmp_path / "cut.json")
    (tmp_path / "dup.json").write_text(json.dumps({"kind": "char", "symbols": ["a", "a"]}))
    one_line_error(DataError, text.load_vocabulary, tmp_path / "dup.json")
    (tmp_path / "kind.json").write_text(json.dumps({"kind": "word", "symbols": []}))
    one_line_error(DataError, text.load_vocabulary, tmp_path / "kind.json")


# --- windows

def test_windows_are_shifted_slices_of_the_tokens():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 50, 300).astype(np.int32)
    length, batch = 16, 8
    for training in (True, False):
        by_start = text.text_dataset(np.arange(300), length, batch, training=training, seed=4)
        real = text.text_dataset(values, length, batch, training=training, seed=4)
        assert real.element_spec[0].shape == (batch, length)
        assert real.element_spec[0].dtype == tf.int32
        for (sx, _), (x, y) in zip(by_start, real):  # the same order: it depends on counts only
            starts = sx.numpy()[:, 0]
            np.testing.assert_array_equal(x, values[starts[:, None] + np.arange(length)])
            np.testing.assert_array_equal(y, values[starts[:, None] + np.arange(1, length + 1)])
            np.testing.assert_array_equal(y[:, :-1], x[:, 1:])


def test_training_takes_every_start_once_per_pass():
    tokens, length = np.arange(23), 4
    count = text.num_windows(23, length, training=True)
    assert count == 19
    full = text.text_dataset(tokens, length, 3, training=True, drop_remainder=False)
    assert int(full.cardinality()) == 7
    for starts in passes(full, epochs=range(3)):
        assert sorted(starts) == list(range(count))
    dropped = text.text_dataset(tokens, length, 3, training=True, drop_remainder=True)
    starts = passes(dropped)[0]
    assert int(dropped.cardinality()) == 6 and len(set(starts)) == len(starts) == 18
    assert starts.max() + length < 23  # every target is a real token


def test_training_windows_never_reach_the_validation_tokens(tmp_path):
    (tmp_path / "t.txt").write_text("".join(chr(97 + i % 26) for i in range(400)))
    splits = text.load_text_dataset(tmp_path / "t.txt", sequence_length=10)
    ids = np.arange(len(splits.train))
    windows = text.text_dataset(ids, 10, 4, training=True).as_numpy_iterator()
    last = max(int(y.max()) for _, y in windows)
    assert last == len(splits.train) - 1  # the last training token, and nothing after it


def test_the_order_depends_on_seed_and_epoch_alone():
    tokens = np.arange(200)
    epoch = tf.Variable(0, dtype=tf.int64)

    def build(seed=1):
        return text.text_dataset(tokens, 8, 4, training=True, seed=seed, epoch=epoch)

    uninterrupted = passes(build(), epoch, range(4))
    assert len({tuple(p) for p in uninterrupted}) == 4
    assert all(sorted(p) == list(range(192)) for p in uninterrupted)
    for k in (3, 1):  # a fresh pipeline, as after a restart, with the epoch set to k
        np.testing.assert_array_equal(passes(build(), epoch, [k])[0], uninterrupted[k])
    assert not np.array_equal(passes(build(seed=2), epoch, [1])[0], uninterrupted[1])
    assert int(build().cardinality()) == 48


def test_epochs_of_some_steps_walk_the_stream_of_passes():
    epoch = tf.Variable(0, dtype=tf.int64)

    def build():  # 36 windows, 9 batches a pass, 4 batches an epoch
        return text.text_dataset(np.arange(40), 4, 4, training=True, seed=5, epoch=epoch,
                                 steps_per_epoch=4)

    assert int(build().cardinality()) == 4
    epochs = passes(build(), epoch, range(9))  # 9 epochs of 4 batches: 4 whole passes
    assert all(len(e) == 16 for e in epochs)
    stream = np.concatenate(epochs).reshape(4, 36)
    assert all(sorted(p) == list(range(36)) for p in stream)
    assert len({tuple(p) for p in stream}) == 4
    whole = passes(text.text_dataset(np.arange(40), 4, 4, training=True, seed=5, epoch=epoch),
                   epoch, [2])[0]
    np.testing.assert_array_equal(stream[2], whole)  # pass 2 is the one-pass mode's epoch 2
    for k in (7, 3):  # resumed at epoch k
        np.testing.assert_array_equal(passes(build(), epoch, [k])[0], epochs[k])
    one_line_error(ConfigError, text.text_dataset, np.arange(40), 4, 4, True, steps_per_epoch=0)


def test_fit_reads_the_epoch_of_each_epoch_from_the_counter():
    from tfaccel.keras import keras
    from tfaccel.train.resume import EpochCounter

    seen = []

    class Recording(keras.Sequential):
        def train_step(self, data):
            seen.append(data[0].numpy()[:, 0])
            return super().train_step(data)

    def build(epoch):
        return text.text_dataset(np.arange(60), 4, 4, training=True, seed=2, epoch=epoch,
                                 steps_per_epoch=3)

    counter = EpochCounter()
    model = Recording([keras.layers.Embedding(60, 2), keras.layers.Dense(60)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  run_eagerly=True)
    model.fit(build(counter.epoch), epochs=4, steps_per_epoch=3, verbose=0, callbacks=[counter])
    epoch = tf.Variable(0, dtype=tf.int64)
    expected = passes(build(epoch), epoch, range(4))
    np.testing.assert_array_equal(np.concatenate(seen), np.concatenate(expected))


def test_the_epoch_is_read_when_a_pass_starts():
    epoch = tf.Variable(2, dtype=tf.int64)
    dataset = text.text_dataset(np.arange(100), 4, 8, training=True, seed=0, epoch=epoch)
    expected = passes(dataset)[0]
    iterator = iter(dataset)
    first = [next(iterator)[0].numpy()[:, 0] for _ in range(3)]
    epoch.assign(5)  # as an epoch counter would, while this pass is still being read
    rest = [x.numpy()[:, 0] for x, _ in iterator]
    np.testing.assert_array_equal(np.concatenate(first + rest), expected)


def test_without_an_epoch_each_pass_reshuffles_reproducibly():
    def orders():
        return passes(text.text_dataset(np.arange(100), 4, 8, training=True, seed=3),
                      epochs=range(3))

    first = orders()
    assert len({tuple(p) for p in first}) == 3
    for a, b in zip(first, orders()):
        np.testing.assert_array_equal(a, b)
    # Whatever global seed the process set (tests before this one set several): the same.
    for global_seed in (0, 7):
        tf.random.set_seed(global_seed)
        for a, b in zip(first, orders()):
            np.testing.assert_array_equal(a, b)


def test_validation_windows_do_not_overlap_and_keep_their_order():
    tokens, length = np.arange(50), 4
    assert text.num_windows(50, length, training=False) == 12
    dataset = text.text_dataset(tokens, length, 5, training=False, drop_remainder=False)
    for _ in range(2):  # the second pass comes from the cache, the same
        batches = list(dataset.as_numpy_iterator())
        x = np.concatenate([b[0] for b in batches])
        y = np.concatenate([b[1] for b in batches])
        np.testing.assert_array_equal(x.reshape(-1), np.arange(48))
        np.testing.assert_array_equal(y.reshape(-1), np.arange(1, 49))
        assert [len(b[0]) for b in batches] == [5, 5, 2]
    assert int(text.text_dataset(tokens, length, 5, training=False).cardinality()) == 2


def test_bad_pipeline_arguments():
    tokens = np.arange(20)
    assert "batch_size=0" in one_line_error(ConfigError, text.text_dataset, tokens, 4, 0, True)
    one_line_error(ConfigError, text.text_dataset, tokens, 0, 2, True)
    message = one_line_error(DataError, text.text_dataset, tokens, 4, 32, training=True)
    assert "16" in message and "--batch_size" in message
    one_line_error(DataError, text.text_dataset, np.zeros((4, 5), np.int32), 2, 1, True)
    one_line_error(DataError, text.text_dataset, np.zeros(9, np.float32), 2, 1, True)


# --- reading files and folders

def test_a_folder_is_read_in_sorted_path_order(tmp_path):
    files = {"b.txt": "bee", "a.md": "# a", "sub/c.py": "x = 1", "sub/a.rst": "rst",
             "z.bin": "ignored", ".hidden/d.txt": "hidden", "empty.txt": ""}
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(content)
    corpus, source = text.read_corpus(tmp_path)
    assert corpus == "# a\nbee\nrst\nx = 1"
    assert source == f"{tmp_path} (4 files)"
    (tmp_path / "bom.txt").write_bytes("\ufeffé".encode())
    assert text.read_corpus(tmp_path / "bom.txt") == ("é", str(tmp_path / "bom.txt"))


def test_bad_text_inputs_get_one_line(tmp_path):
    missing = one_line_error(DataError, text.read_corpus, tmp_path / "nope.txt")
    assert "nope.txt" in missing and "--data_dir" in missing
    (tmp_path / "empty.txt").write_text("")
    assert "empty" in one_line_error(DataError, text.read_corpus, tmp_path / "empty.txt")
    (tmp_path / "folder").mkdir()
    assert "no text files" in one_line_error(DataError, text.read_corpus, tmp_path / "folder")
    (tmp_path / "folder" / "blank.md").write_text("")
    assert "empty" in one_line_error(DataError, text.read_corpus, tmp_path / "folder")
    (tmp_path / "nul.txt").write_bytes(b"hello\0world")
    message = one_line_error(DataError, text.load_text_dataset, tmp_path / "nul.txt")
    assert "nul.txt" in message and "offset 5" in message
    (tmp_path / "latin1.txt").write_bytes("abc é".encode("latin-1"))
    message = one_line_error(DataError, text.read_corpus, tmp_path / "latin1.txt")
    assert "latin1.txt" in message and "offset 4" in message and "0xe9" in message
    (tmp_path / "folder" / "x.txt").write_bytes(b"\xff\xfe")
    assert "x.txt" in one_line_error(DataError, text.read_corpus, tmp_path / "folder")


def test_a_text_shorter_than_one_window_says_how_much_is_needed(tmp_path):
    path = tmp_path / "short.txt"
    path.write_text("x" * 100)
    message = one_line_error(DataError, text.load_text_dataset, path, sequence_length=64)
    assert "shorter than one window" in message and "--sequence_length" in message
    needed = int(message.split("at least ")[1].split()[0])
    path.write_text("x" * needed)
    splits = text.load_text_dataset(path, sequence_length=64)
    assert min(len(splits.train), len(splits.validation)) >= 65
    path.write_text("x" * (needed - 1))
    one_line_error(DataError, text.load_text_dataset, path, sequence_length=64)
    path.write_text("世" * 30)  # validation: 3 characters, 9 bytes: enough for bytes only
    one_line_error(DataError, text.load_text_dataset, path, "char", sequence_length=8)
    assert len(text.load_text_dataset(path, "byte", sequence_length=8).validation) == 9


def test_bad_settings_get_one_line():
    assert "--tokenizer=byte" in one_line_error(ConfigError, text.load_text_dataset,
                                                tokenizer="word")
    one_line_error(ConfigError, text.load_text_dataset, sequence_length=0)
    one_line_error(ConfigError, text.load_text_dataset, validation_fraction=1.0)
    one_line_error(ConfigError, text.build_vocabulary, "abc", "bpe")
    one_line_error(DataError, text.build_vocabulary, "")
