"""Importing TensorFlow without its start-up chatter on stderr.

Why: TensorFlow 2.21 logs through absl's C++ logging. Its shared libraries
print, while they load, "WARNING: All log messages before absl::InitializeLog()
is called are written to STDERR" and two I-level lines (oneDNN, "Could not find
cuda drivers"), once for each of its two libraries, before it has read
``TF_CPP_MIN_LOG_LEVEL``; that variable only filters what is logged after
``import tensorflow``. On a machine without GPUs, the first device query then
logs an E-level "failed call to cuInit", which level 2 keeps. Measured on these
machines: with ``TF_CPP_MIN_LOG_LEVEL=2`` 6 lines at import and 7 with the device
query; unset, 8 and 9.

`import_tensorflow` sends file descriptor 2 to a temporary file while TensorFlow
loads and lists its GPUs (which is allowed before CPUs are split, GPU memory is
configured or the host allocator is chosen), then writes back every line that
``TF_CPP_MIN_LOG_LEVEL`` (default here 2: errors and worse) would have let
through, except the cuInit failure when no GPU is visible (unless the level is
0, everything): that is the expected answer on a CPU machine, not an error.
Anything else (Python warnings, a traceback of a broken install) comes through
unchanged.

Example:

    from tfaccel.quiet import import_tensorflow

    tf = import_tensorflow()     # nothing on stderr on a healthy CPU machine
"""

import os
import re
import sys
import tempfile

_LOG_LINE = re.compile(r"^([IWEF])\d{4} ")
_LEVELS = {"I": 0, "W": 1, "E": 2, "F": 3}
_BANNER = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_NO_GPU_LINE = "failed call to cuInit"


def min_log_level():
    """TF_CPP_MIN_LOG_LEVEL as an int (TensorFlow's default 0 when unset or not a number)."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def kept_lines(text, level, have_gpu):
    """The lines of captured start-up stderr `text` that log level `level` lets through."""
    kept = []
    for line in text.splitlines():
        match = _LOG_LINE.match(line)
        if match:
            if _LEVELS[match.group(1)] < level:
                continue
            if not have_gpu and level > 0 and _NO_GPU_LINE in line:
                continue
        elif line.strip() == _BANNER and level > 0:
            continue
        kept.append(line)
    return kept


def import_tensorflow():
    """Imports TensorFlow and lists its GPUs with the start-up lines filtered; returns `tf`.

    A second call (TensorFlow already imported) returns it at once.
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    level = min_log_level()
    sys.stderr.flush()
    saved = os.dup(2)
    have_gpu = False
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow as tf  # deferred: TensorFlow, the import this module quiets

            have_gpu = bool(tf.config.list_physical_devices("GPU"))
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode("utf-8", errors="replace")
            lines = kept_lines(text, level, have_gpu)
            if lines:
                sys.stderr.write("\n".join(lines) + "\n")
                sys.stderr.flush()
    return tf
