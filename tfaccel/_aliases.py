"""The modules' old flat names (`tfaccel.precision`, ...) kept as aliases of their new homes.

tfaccel grouped its modules by area (see docs/architecture.md); the flat module
names still work: ``import tfaccel.precision``, ``from tfaccel.prune import
PruneConfig`` and ``python -m tfaccel.launch`` all reach the one module in its
new place (the same module object, not a copy). Names that moved between
modules are listed in docs/architecture.md.
"""

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "tfaccel.models": "tfaccel.train.models",
    "tfaccel.training": "tfaccel.train.training",
    "tfaccel.schedules": "tfaccel.train.schedules",
    "tfaccel.resume": "tfaccel.train.resume",
    "tfaccel.precision": "tfaccel.train.precision",
    "tfaccel.performance.precision": "tfaccel.train.precision",
    "tfaccel.distribute.stages": "tfaccel.parallel.stages",
    "tfaccel.distribute.pipeline": "tfaccel.parallel.pipeline",
    "tfaccel.accumulate": "tfaccel.performance.accumulate",
    "tfaccel.memory": "tfaccel.performance.memory",
    "tfaccel.diagnose": "tfaccel.performance.diagnose",
    "tfaccel.batch_size": "tfaccel.performance.trials",
    "tfaccel.launch": "tfaccel.distribute.launch",
    "tfaccel.prune": "tfaccel.compress.prune",
    "tfaccel.sparsity": "tfaccel.compress.sparsity",
    "tfaccel.quantize": "tfaccel.compress.quantize",
    "tfaccel.tflite": "tfaccel.compress.tflite",
    "tfaccel.report": "tfaccel.compress.report",
    # Fragments folded back into the module of their idea (0.2).
    "tfaccel.performance.budget": "tfaccel.performance.batch_search",
    "tfaccel.performance.devices": "tfaccel.performance.plan",
    "tfaccel.performance.plan_settings": "tfaccel.performance.plan",
    "tfaccel.compress.pruning_layers": "tfaccel.compress.pruning_plan",
    "tfaccel.scalar_file": "tfaccel.summaries",
    "tfaccel.keras_tensorboard": "tfaccel.summaries",
    "tfaccel.train.schedule_bridge": "tfaccel.train.schedules",
    "tfaccel.train.backup_timing": "tfaccel.train.resume",
    "tfaccel.train.backup_keras3": "tfaccel.train.resume",
}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass  # the target module ran when it was imported

    def get_code(self, fullname):  # `python -m tfaccel.launch` runs the target's code
        return importlib.util.find_spec(self.target).loader.get_code(self.target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(MOVED[fullname]))


def submodule(package, name):
    """`package.name` when it is a submodule of `package` (imported now), else None.

    An area package's `__getattr__` calls it, so that `tfaccel.compress.tflite_eval`
    works as an attribute even before anything imported that module.
    """
    if name.startswith("_"):
        return None
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{package}.{name}":
            raise  # the submodule exists but needs something missing
        return None


def submodule_getattr(package, modules=(), names=None):
    """A module `__getattr__` for an area package: its submodules, then `names` ({name:
    value}), then the public names (`__all__`) of `modules`, each loaded on first use (a
    module's name is kept in the package once found)."""

    def __getattr__(name):
        module = submodule(package, name)
        if module is not None:
            return module
        if names and name in names:
            return names[name]
        if not name.startswith("_"):
            for module_name in modules:
                module = importlib.import_module(module_name)
                if name in module.__all__:
                    value = getattr(module, name)
                    setattr(sys.modules[package], name, value)
                    return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def install():
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.append(_AliasFinder())
