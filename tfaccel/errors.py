"""Typed errors raised by tfaccel helpers.

Every error message is one line that names the bad value and says what to do
instead. Recipes turn a `TfaccelError` into that line on stderr and a non-zero
exit, without a traceback (see `recipes/common.py`).
"""


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
