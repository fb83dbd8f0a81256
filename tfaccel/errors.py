"""Typed errors raised by tfaccel helpers.

Every error message is one line that names the bad value and says what to do
instead. Recipes turn a `TfaccelError` into that line on stderr and a non-zero
exit, without a traceback (see `recipes/common.py`).
"""


def first_line(error, limit=200, with_type=False):
    """The first line of a foreign exception's message, for quoting in a one-line error.

    TensorFlow's, Keras's and users' exceptions often carry pages of text; a tfaccel
    error quotes only the first non-empty line (Keras's "Exception encountered when
    calling layer" wrapper skipped, the cause follows it), cut to `limit` characters.
    An exception without a message gives its type name. With `with_type` the line
    starts with the type name ('ValueError: bad rank'), which says more than the
    message alone when the error comes from a user's code or a layer.
    """
    text = str(getattr(error, "message", error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Exception encountered when calling layer"):
        lines = lines[1:]
    if not lines:
        return type(error).__name__
    first = lines[0] if len(lines[0]) <= limit else lines[0][:limit] + "..."
    return f"{type(error).__name__}: {first}" if with_type else first


class TfaccelError(Exception):
    """Base class of every error tfaccel raises on purpose."""


class ConfigError(TfaccelError, ValueError):
    """A flag, argument or configuration value is invalid."""


class DataError(TfaccelError, ValueError):
    """A dataset, file or directory cannot be used as given."""


class ModelError(TfaccelError, ValueError):
    """A model cannot be built, loaded or used as given."""


class WrongKerasError(ModelError, TypeError):
    """A Keras 3 object was given where tfaccel needs a tf_keras (Keras 2) one."""


class UnsupportedLayerError(ModelError):
    """A model holds layers that an optimization cannot handle."""


class TrainingError(TfaccelError, ArithmeticError):
    """Training was stopped because going on would only waste time (e.g. the loss became NaN)."""
