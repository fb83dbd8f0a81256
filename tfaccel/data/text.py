"""Text for language models: a corpus every machine has, vocabularies, splits by position.

`load_text_dataset` reads a text (by default the Python standard library's
``pydoc_data.topics``: 465,048 characters, 103 distinct symbols, present
wherever Python is, so nothing is downloaded), tokenizes it and cuts it by
position: the first 90% trains, the last 10% validates, so no window of one
split holds a token of the other (random windows would put near-copies of
training text in validation). `text_dataset` (from `text_pipeline`) turns
either part into batches of next-token windows.

Two tokenizers: ``char`` (the distinct characters of the training part, id 0
for any other character, `UNKNOWN`) and ``byte`` (UTF-8 bytes, 256 ids, nothing
unknown, about as many tokens as characters for English). A `Vocabulary` is
saved beside a model as JSON, so that a loaded model reads and writes the same ids.

Example:

    from tfaccel.data import text

    splits = text.load_text_dataset(tokenizer="char", sequence_length=64)
    print(splits.vocab.size, len(splits.train), len(splits.validation))  # 104 418543 46505
    train = text.text_dataset(splits.train, 64, batch_size=12, training=True, seed=0)
    splits.vocab.save("/tmp/vocabulary.json")
    print(text.load_vocabulary("/tmp/vocabulary.json").decode(splits.train[:5]))
"""

import dataclasses
import functools
import json
import os
import warnings

import numpy as np

from tfaccel.choices import TOKENIZERS
from tfaccel.data.text_pipeline import _positive, num_windows, text_dataset
from tfaccel.errors import ConfigError, DataError
from tfaccel.io import write_json

UNKNOWN = "\ufffd"
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")
DEFAULT_CORPUS = "pydoc_data.topics"
_FORMAT = "tfaccel.vocabulary"

__all__ = ["DEFAULT_CORPUS", "TOKENIZERS", "TextSplits", "UNKNOWN", "Vocabulary",
           "build_vocabulary", "load_text_dataset", "load_vocabulary", "num_windows",
           "read_corpus", "read_text", "text_dataset"]


# ------------------------------------------------------------------ reading

def _decode_file(path):
    with open(path, "rb") as f:
        data = f.read()
    nul = data.find(b"\0")
    if nul >= 0:
        raise DataError(f"{path} is a binary file (a NUL byte at offset {nul}): give UTF-8 text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                        f"{e.start}): convert it to UTF-8 or remove it") from None
    return text.removeprefix("\ufeff")


def _text_files(folder):
    """Text files below `folder` (hidden files and folders skipped), sorted by relative path."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [os.path.relpath(os.path.join(root, f), folder) for f in files
                  if f.lower().endswith(TEXT_SUFFIXES) and not f.startswith(".")]
    return [os.path.join(folder, f) for f in sorted(found)]


def read_corpus(data_dir=None):
    """The text of a corpus and a description of where it came from.

    Example:

        text, source = read_corpus()            # the stdlib corpus, 465,048 characters
        text, source = read_corpus("notes/")    # every *.txt, *.md, *.rst, *.py below notes/

    Args:
      data_dir: None for ``pydoc_data.topics`` (its topics joined with newlines, keys in
        sorted order), a text file (read as UTF-8 whatever its name), or a folder: every
        ``*.txt``, ``*.md``, ``*.rst`` and ``*.py`` file below it (recursively, hidden ones
        skipped, in sorted path order; empty files skipped), joined with newlines.

    Returns:
      ``(text, description)``: the description is "pydoc_data.topics", the file's path,
      or the folder's path with its number of files.

    Raises:
      DataError: a missing path, an empty file or a folder without text, a binary file
        (a NUL byte, or bytes that are not UTF-8: the file and the offset are named).
    """
    if data_dir is None:
        # deferred: pydoc_data's 1 MB of text, only for the default corpus
        from pydoc_data.topics import topics

        return "\n".join(topics[k] for k in sorted(topics)), DEFAULT_CORPUS
    path = os.fspath(data_dir)
    if os.path.isdir(path):
        files = _text_files(path)
        if not files:
            raise DataError(f"no text files ({', '.join('*' + s for s in TEXT_SUFFIXES)}) in "
                            f"{path}: give --data_dir= a text file or a folder holding some")
        texts = [t for t in map(_decode_file, files) if t]
        if not texts:
            raise DataError(f"every text file in {path} is empty ({len(files)} files): "
                            "give --data_dir= a folder with text in it")
        return "\n".join(texts), f"{path} ({len(texts)} files)"
    if not os.path.exists(path):
        raise DataError(f"no such file or folder: {path}: give --data_dir= a text file or a "
                        "folder of text files (or leave it out for the stdlib corpus)")
    text = _decode_file(path)
    if not text:
        raise DataError(f"{path} is empty: give --data_dir= a file with text in it")
    return text, path


# --------------------------------------------------------------- vocabulary

def _check_kind(kind):
    if kind not in TOKENIZERS:
        raise ConfigError(f"tokenizer={kind!r} is not one of {', '.join(TOKENIZERS)}: use "
                          "--tokenizer=char (the text's characters) or --tokenizer=byte (UTF-8)")


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The ids a language model reads and writes, and the text they stand for.

    ``char``: id 0 is `UNKNOWN` (any character the training text did not hold),
    ids 1.. are `symbols` in order. ``byte``: the 256 values of UTF-8 bytes.

    Example:

        vocab = build_vocabulary("hello world")
        ids = vocab.encode("hello")              # int32 [4 3 5 5 6] (0 is UNKNOWN)
        vocab.decode(ids)                        # 'hello'
        vocab.encode("hi!", unknown="replace")   # '!' (and 'i') -> 0
        Vocabulary("byte").encode("é")           # [195 169]
    """

    kind: str
    symbols: tuple = ()

    def __post_init__(self):
        _check_kind(self.kind)
        symbols = tuple(self.symbols)
        object.__setattr__(self, "symbols", symbols)
        if self.kind == "byte" and symbols:
            raise DataError("a byte vocabulary has no symbols (its ids are the 256 byte values)")
        bad = [s for s in symbols if not isinstance(s, str) or len(s) != 1 or s == UNKNOWN]
        if bad or len(set(symbols)) != len(symbols):
            raise DataError(f"vocabulary symbols must be distinct single characters other than "
                            f"{UNKNOWN!r} (id 0); got {bad[:5] or 'duplicates'}")

    @property
    def size(self):
        """Number of ids: ``len(symbols) + 1`` (char, with `UNKNOWN`) or 256 (byte)."""
        return 256 if self.kind == "byte" else len(self.symbols) + 1

    @functools.cached_property
    def _lookup(self):
        """Sorted code points and their ids (UNKNOWN itself included, as id 0)."""
        codes = np.array([ord(s) for s in (*self.symbols, UNKNOWN)], dtype=np.uint32)
        order = np.argsort(codes)
        return codes[order], ((order + 1) % (len(codes))).astype(np.int32)

    def encode(self, text, unknown="error"):
        """Token ids (int32) of `text`.

        Args:
          text: a string.
          unknown: for a char vocabulary, what a character outside it does: 'error'
            (DataError naming up to 10 of them) or 'replace' (id 0, `UNKNOWN`).

        Raises:
          ConfigError: `unknown` is neither 'error' nor 'replace'.
          DataError: characters outside a char vocabulary, with ``unknown='error'``.
        """
        if unknown not in ("error", "replace"):
            raise ConfigError(f"unknown={unknown!r}: use 'error' or 'replace'")
        if self.kind == "byte":
            return np.frombuffer(text.encode("utf-8", errors="replace"), np.uint8).astype(np.int32)
        points = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), "<u4")
        codes, ids = self._lookup
        where = np.minimum(np.searchsorted(codes, points), len(codes) - 1)
        found = codes[where] == points
        if unknown == "error":
            missing = np.unique(points[~found])
            if len(missing):
                shown = ", ".join(repr(chr(c)) for c in missing[:10])
                more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
                raise DataError(f"{len(missing)} characters are not in the vocabulary: "
                                f"{shown}{more}: remove them, or train with --tokenizer=byte")
        return np.where(found, ids[where], 0).astype(np.int32)

    def decode(self, ids):
        """The text of token ids (bytes that are not UTF-8 decode to U+FFFD); DataError for an
        id outside ``0 .. size - 1``."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if (bad := ids[(ids < 0) | (ids >= self.size)]).size:
            raise DataError(f"token id {int(bad[0])} is outside this {self.kind} vocabulary "
                            f"(0 .. {self.size - 1}): decode ids of the model it came with")
        if self.kind == "byte":
            return bytes(ids.astype(np.uint8)).decode("utf-8", errors="replace")
        table = np.array([UNKNOWN, *self.symbols])
        return "".join(table[ids].tolist())

    def to_json(self):
        """A JSON-able dict that `from_json` reads back."""
        return {"format": _FORMAT, "kind": self.kind, "size": self.size,
                "symbols": list(self.symbols)}

    @classmethod
    def from_json(cls, d):
        """The `Vocabulary` of a `to_json` dict; DataError if it is not one."""
        if not isinstance(d, dict) or d.get("format", _FORMAT) != _FORMAT or "kind" not in d:
            raise DataError("not a tfaccel vocabulary (a JSON object with 'kind' and 'symbols' "
                            "written by Vocabulary.save): export the model again")
        if d["kind"] not in TOKENIZERS:
            raise DataError(f"vocabulary kind {d['kind']!r} is not one of {', '.join(TOKENIZERS)}")
        vocab = cls(d["kind"], tuple(d.get("symbols", ())))
        if "size" in d and d["size"] != vocab.size:
            raise DataError(f"the vocabulary says size {d['size']} but holds {vocab.size} ids: "
                            "the file was edited or cut; export the model again")
        return vocab

    def save(self, path):
        """Writes the vocabulary as JSON to `path` atomically; returns `path`."""
        return write_json(path, self.to_json())


def build_vocabulary(text, kind="char"):
    """The vocabulary of `text`: its sorted distinct characters (char), or the 256 bytes."""
    _check_kind(kind)
    if kind == "byte":
        return Vocabulary("byte")
    if not text:
        raise DataError("cannot build a character vocabulary from an empty text")
    return Vocabulary("char", tuple(sorted(set(text) - {UNKNOWN})))


def load_vocabulary(path):
    """Reads a vocabulary written by `Vocabulary.save`.

    Raises:
      DataError: a missing file, or one that is not a saved vocabulary.
    """
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except FileNotFoundError:
        raise DataError(f"no vocabulary at {path}: export the model with its vocabulary "
                        "(tfaccel.train.generate.export_language_model)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not a JSON vocabulary ({e.__class__.__name__}): export the "
                        "model again") from None
    return Vocabulary.from_json(d)


# ------------------------------------------------------------------ splits

@dataclasses.dataclass(frozen=True, eq=False)
class TextSplits:
    """A tokenized text cut by position, and its vocabulary.

    Attributes:
      train: int32 token ids of the first part of the text (90% by default).
      validation: int32 token ids of the rest; characters the training part does not hold
        are `UNKNOWN` (id 0) there, as they would be for a model trained on it.
      vocab: the `Vocabulary`, built from the training part only.
      source: where the text came from ("pydoc_data.topics", a path).
      num_characters: characters in the whole text.
    """

    train: np.ndarray
    validation: np.ndarray
    vocab: Vocabulary
    source: str
    num_characters: int


def _validation_chars(num_characters, fraction):
    return int(num_characters * fraction + 0.5)


def _characters_needed(length, fraction):
    """The shortest text whose two parts each hold one window of `length` (+1) characters."""
    n = max(2 * (length + 1), int((length + 0.5) / min(fraction, 1 - fraction)) - 2)
    while not (_validation_chars(n, fraction) >= length + 1
               and n - _validation_chars(n, fraction) >= length + 1):
        n += 1
    return n


def read_text(data_dir=None):
    """Deprecated (kept for one release): `read_corpus`, which it calls."""
    warnings.warn("tfaccel.data.text.read_text is deprecated: use read_corpus(data_dir) "
                  "(tfaccel.read_corpus), the same reader", DeprecationWarning, stacklevel=2)
    return read_corpus(data_dir)


def load_text_dataset(data_dir=None, tokenizer="char", sequence_length=64,
                      validation_fraction=0.1):
    """Reads, tokenizes and splits a text by position (train first, validation last).

    Example:

        splits = load_text_dataset("book.txt", tokenizer="byte", sequence_length=128)
        splits.vocab.size        # 256

    Args:
      data_dir: see `read_corpus` (None: the stdlib corpus).
      tokenizer: 'char' or 'byte' (`TOKENIZERS`).
      sequence_length: tokens per window; each part must hold one window plus its target.
      validation_fraction: the share of characters, at the end of the text, kept for
        validation.

    Returns:
      A `TextSplits`.

    Raises:
      ConfigError: a tokenizer that is not one of `TOKENIZERS`, a sequence length that is
        not a positive integer, a fraction outside (0, 1).
      DataError: what `read_corpus` refuses, or a part shorter than one window (the message
        says how many characters are needed).
    """
    _check_kind(tokenizer)
    length = _positive("sequence_length", sequence_length, 64)
    if not 0 < validation_fraction < 1:
        raise ConfigError(f"validation_fraction={validation_fraction} must be between 0 and 1 "
                          "(exclusive), e.g. 0.1")
    text, source = read_corpus(data_dir)
    cut = len(text) - _validation_chars(len(text), validation_fraction)

    def check(name, num_tokens):
        if num_tokens < length + 1:
            raise DataError(
                f"text shorter than one window: the {name} part of {source} holds {num_tokens} "
                f"tokens and one window of --sequence_length={length} needs {length + 1}: give "
                f"at least {_characters_needed(length, validation_fraction)} characters of text "
                f"(it has {len(text)}), or a smaller --sequence_length")

    if tokenizer == "char":  # a character is a token: check before building anything
        check("training", cut)
        check("validation", len(text) - cut)
    vocab = build_vocabulary(text[:cut], tokenizer)
    train = vocab.encode(text[:cut])
    validation = vocab.encode(text[cut:], unknown="replace")
    check("training", len(train))
    check("validation", len(validation))
    return TextSplits(train, validation, vocab, source, len(text))
