"""Training: the model zoo and model files, compile/evaluate/export, learning-rate schedules, and
backup/resume of interrupted runs."""

from tfaccel import _aliases


def __getattr__(name):
    module = _aliases.submodule(__name__, name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return module
