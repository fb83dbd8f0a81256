"""Writing results so that nothing is ever left half-written.

Everything tfaccel writes as a result (models, reports, plots, JSON) goes to a
temporary path beside the final one and is renamed into place only once it is
complete: a crash or Ctrl-C leaves either the old result or none.

Example:

    from tfaccel.io import atomic_path, write_json

    write_json("out/metrics.json", {"accuracy": 0.98})
    with atomic_path("out/model.keras") as tmp:
        model.save(tmp)           # renamed to out/model.keras on success
"""

import contextlib
import gzip
import io
import json
import os
import shutil
import tarfile
import tempfile

from tfaccel.errors import ConfigError


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


@contextlib.contextmanager
def atomic_path(final_path):
    """Yields a temporary path (same folder, `.tmp-<pid>-<name>`), renamed to `final_path` after.

    Works for files and directories (e.g. a SavedModel). An existing
    `final_path` is replaced only after the new one is complete.
    """
    final_path = os.fspath(final_path)
    parent = os.path.dirname(os.path.abspath(final_path))
    os.makedirs(parent, exist_ok=True)
    base = os.path.basename(final_path)
    # The whole name last: Keras decides the format from it (.keras, .weights.h5).
    tmp = os.path.join(parent, f".tmp-{os.getpid()}-{base}")
    _remove(tmp)
    try:
        yield tmp
        if not os.path.lexists(tmp):
            raise FileNotFoundError(f"nothing was written to {tmp}")
        if os.path.isdir(tmp) and os.path.isdir(final_path):
            old = tempfile.mkdtemp(prefix=f".{base}.old-", dir=parent)
            os.rmdir(old)
            os.replace(final_path, old)
            os.replace(tmp, final_path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            if os.path.isdir(final_path):
                shutil.rmtree(final_path)
            os.replace(tmp, final_path)
    finally:
        _remove(tmp)


def check_writable_dir(path, what="output folder"):
    """Raises ConfigError unless `path` is, or can be made, a folder this process can write.

    Nothing is left behind: a missing `path` is not created; its nearest existing parent
    is tried instead. The test is a real file created and removed, not the mode bits,
    because root ignores those while a read-only mount or an immutable folder still
    refuses root.

    Args:
      path: the folder a run will write to.
      what: how the message names it, e.g. '--model_dir'.

    Returns:
      `path`.
    """

    where = os.path.abspath(os.fspath(path))
    if os.path.lexists(where) and not os.path.isdir(where):
        raise ConfigError(f"{what}={path} is a file, not a folder: give a folder path (it is "
                          "created if missing)")
    probe = where
    while not os.path.isdir(probe):
        parent = os.path.dirname(probe)
        if os.path.lexists(probe):  # a file where a parent folder should be
            raise ConfigError(f"{what}={path}: {probe} is a file, not a folder: give a path "
                              "whose parents are folders")
        probe = parent
    if why := cannot_write(probe):
        inside = "" if probe == where else " (its first existing parent)"
        raise ConfigError(f"{what}={path}: cannot write to {probe}{inside} ({why}): give a "
                          "folder you can write to")
    return path


def cannot_write(folder):
    """Why a file cannot be created in the existing `folder` (e.g. 'Read-only file system'),
    or None when it can. Tries for real, leaving nothing behind."""
    try:
        fd, name = tempfile.mkstemp(prefix=".tfaccel-write-test-", dir=folder)
    except OSError as e:
        return e.strerror or type(e).__name__
    os.close(fd)
    os.remove(name)
    return None


def write_text(path, text):
    """Writes `text` to `path` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return path


def write_bytes(path, data):
    """Writes `data` to `path` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
    return path


def write_json(path, obj):
    """Writes `obj` as indented JSON to `path` atomically."""
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=_jsonable) + "\n")


def _jsonable(value):
    if hasattr(value, "item"):  # numpy and tf scalars
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def file_size(path):
    """Bytes on disk of a file, or of everything below a directory."""
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
    return os.path.getsize(path)


def gzipped_size(path):
    """Bytes of `path` gzip-compressed (a directory is tarred first), the fair size of sparse
    weights."""

    if os.path.isdir(path):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(path, arcname=os.path.basename(path))
        data = buf.getvalue()
    else:
        with open(path, "rb") as f:
            data = f.read()
    return len(gzip.compress(data, compresslevel=9, mtime=0))
