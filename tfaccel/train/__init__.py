"""Training: the model zoo and model files, compile/evaluate/export, learning-rate schedules, and
backup/resume of interrupted runs."""

from tfaccel import _aliases

__getattr__ = _aliases.submodule_getattr(__name__)
