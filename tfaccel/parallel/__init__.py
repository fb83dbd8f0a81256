"""Model and pipeline parallelism: a model's layers split into stages, one per device.

The top area of the library (it uses the planner to balance stages by memory):
`stages` splits a model and prints the stage table, `pipeline` trains the split
model (`pipeline_parallel`, `model_parallel`). The pipeline's names are also this
package's own, as `tfaccel.parallel` was that module before it became a package:

    import tfaccel.parallel

    model = tfaccel.parallel.pipeline_parallel(model, num_stages=2, micro_batches=4)
"""

from tfaccel import _aliases

_MODULES = ("tfaccel.parallel.pipeline", "tfaccel.parallel.stages")


__getattr__ = _aliases.submodule_getattr(__name__, _MODULES)
