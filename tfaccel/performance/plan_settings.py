"""The settings a memory plan depends on (`tfaccel.performance.plan.PlanSettings`).

Kept apart from the plan's arithmetic so that both `tfaccel plan` and the recipes can
check a run's settings, one clear error each, before anything is built.
"""

import dataclasses

from tfaccel.choices import OPTIMIZERS, PRECISIONS
from tfaccel.errors import ConfigError
from tfaccel.performance.devices import parse_device_memory

SLOTS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2, "rmsprop": 1}
"""Optimizer slot variables per parameter (float32), as Keras's optimizers make them."""
FRAMEWORK_MARGIN = 0.05
"""Share of the device kept free for the framework, kernels' workspace and fragmentation."""


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """The run's settings a memory plan depends on.

    Attributes:
      batch_size: examples per device per optimizer step (the per-replica batch).
      precision: float32, mixed_float16 or mixed_bfloat16.
      optimizer: one of `SLOTS`.
      grad_accum_steps: the batch is computed as this many micro-batches, one at a time.
      recompute: recompute activations in the backward pass (per block or layer).
      replicas: data-parallel replicas (each holds the whole model: no ZeRO in TensorFlow).
      stages: pipeline stages (the layers split into this many consecutive parts, one per
        device); micro_batches: how many micro-batches a pipeline splits the batch into.
      device_memory: bytes, or a string for `parse_device_memory`; None: no verdict.
      margin: the share of the device kept for the framework (`FRAMEWORK_MARGIN`).
      input_batches: input batches alive at once: 3 for a tf.data pipeline (the batch in
        use, the prefetch buffer, the next one being made); 1 for a constant input.
    """

    batch_size: int = 32
    precision: str = "float32"
    optimizer: str = "adam"
    grad_accum_steps: int = 1
    recompute: bool = False
    replicas: int = 1
    stages: int = 1
    micro_batches: int = 1
    device_memory: object = None
    margin: float = FRAMEWORK_MARGIN
    input_batches: int = 3

    def checked(self, num_layers=None):
        """These settings, validated (device memory in bytes).

        Raises:
          ConfigError: one line naming the bad setting and the fix.
        """
        for label in ("batch_size", "grad_accum_steps", "replicas", "stages", "micro_batches",
                      "input_batches"):
            value = getattr(self, label)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{label}={value!r}: must be a positive integer")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r}: use one of {', '.join(PRECISIONS)}")
        if self.optimizer not in SLOTS:
            raise ConfigError(f"optimizer {self.optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
        if self.grad_accum_steps > self.batch_size:
            raise ConfigError(f"grad_accum_steps={self.grad_accum_steps} is larger than "
                              f"batch_size={self.batch_size}: each micro-batch needs an example")
        if self.micro_batches > self.batch_size:
            raise ConfigError(f"micro_batches={self.micro_batches} is larger than "
                              f"batch_size={self.batch_size}")
        if num_layers is not None and self.stages > num_layers:
            raise ConfigError(f"stages={self.stages} is more than the model's {num_layers} "
                              "layers: use at most one stage per layer")
        if not 0 <= self.margin < 1:
            raise ConfigError(f"margin={self.margin}: a share of the device in [0, 1)")
        memory = self.device_memory
        if memory is not None and not isinstance(memory, int):
            memory = parse_device_memory(memory)
        return dataclasses.replace(self, device_memory=memory)
