"""Speed and memory: mixed precision, timed trials (auto precision/XLA, batch-size search),
gradient accumulation, memory settings and measurement, and input-pipeline diagnosis."""

from tfaccel import _aliases


def __getattr__(name):
    module = _aliases.submodule(__name__, name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return module
