"""Model and pipeline parallelism: a model's layers split into stages, one per device.

The top area of the library (it uses the planner to balance stages by memory):
`stages` splits a model and prints the stage table, `pipeline` trains the split
model (`pipeline_parallel`, `model_parallel`). The pipeline's names are also this
package's own, as `tfaccel.parallel` was that module before it became a package:

    import tfaccel.parallel

    model = tfaccel.parallel.pipeline_parallel(model, num_stages=2, micro_batches=4)
"""

import importlib

from tfaccel import _aliases

_MODULES = ("tfaccel.parallel.pipeline", "tfaccel.parallel.stages")


def __getattr__(name):
    module = _aliases.submodule(__name__, name)
    if module is not None:
        return module
    if not name.startswith("_"):
        for module_name in _MODULES:
            module = importlib.import_module(module_name)
            if name in module.__all__:
                value = getattr(module, name)
                globals()[name] = value
                return value
    raise AttributeError(f"module 'tfaccel.parallel' has no attribute {name!r}")
