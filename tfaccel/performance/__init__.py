"""Speed and memory: mixed precision, timed trials (auto precision/XLA, batch-size search),
gradient accumulation, memory settings and measurement, and input-pipeline diagnosis."""

from tfaccel import _aliases

__getattr__ = _aliases.submodule_getattr(__name__)
