"""The package's shape: public names kept, no import cycles, small modules, private internals in
one place (tfaccel/_compat/). See docs/architecture.md."""

import ast
import importlib
import pathlib
import re
import subprocess
import sys

import pytest

import tfaccel

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tfaccel"
# Files are sized by their idea: about 500 lines at most, reviewed; past this ceiling a file
# holds more than one idea and is split by idea (never just to pass a count).
MAX_LINES = 650

# Every public name of `tfaccel` before the regrouping (0.1.0 as of dc8e22f): they must resolve.
NAMES_BEFORE = [
    "ConfigError", "ConstantSchedule", "CosineRestartsSchedule", "CosineSchedule", "DATASETS",
    "DataError", "DatasetInfo", "EpochCounter", "EpochExponentialSchedule", "ExponentialSchedule",
    "HardwareMonitor", "InputDiagnosis", "LearningRateLogger", "MODELS", "ModelError",
    "OneCycleSchedule", "PRECISIONS", "PeakMemoryLogger", "PiecewiseSchedule", "PipelineConfig",
    "PolynomialSchedule", "PruneConfig", "PruningPlan", "ResumeReporter", "SCHEDULES",
    "STRATEGIES", "SparsityLogger", "Splits", "StepSchedule", "StopOnNonFiniteLoss",
    "TensorBoard", "TfaccelError", "ThroughputLogger", "TrainingError", "UnsupportedLayerError",
    "WrongKerasError", "apply_precision", "auto_select", "backup_callbacks", "batch_dataset",
    "build_model", "build_pipeline", "build_splits", "check_m_by_n", "check_qat_ready",
    "check_quantize_aware", "choose_fastest", "compare_latency", "comparison_rows",
    "compile_classifier", "configure_gpu_memory", "convert_to_tflite", "diagnose_input",
    "enable_gradient_accumulation", "ensure_tf_keras", "evaluate", "evaluate_tflite",
    "export_model", "find_batch_size", "flatten_model", "free_memory", "from_arrays",
    "host_allocator", "is_keras3_object", "keras", "layer_dtypes", "load_dataset", "load_digits",
    "load_image_dir", "load_model_file", "load_npz", "load_pruned_model", "load_synthetic",
    "load_tfds", "load_tfrecord", "make_optimizer", "make_pruning_schedule", "make_schedule",
    "make_strategy", "measure_latency", "model_sizes", "per_replica_batch_size", "plan_pruning",
    "pooled_host_allocator_active", "precision_advice", "precision_scope", "prediction_agreement",
    "prune_to_sparsity", "quantize_aware", "read_backup", "read_finished_run", "read_image_tags",
    "read_scalars", "read_text", "remove_backup", "resolve_model", "scale_learning_rate",
    "scaled_gradients", "search_batch_size", "set_precision", "sparsity_report", "split_cpu",
    "steps_per_epoch", "strip_pruning", "tensorboard_command", "tflite_sizes", "time_training",
    "unsupported_layers", "use_pooled_host_allocator", "weight_sparsity", "with_shard_policy",
    "worker_output_dir", "wrap_optimizer", "write_image_tfrecords", "write_report",
]
# Its submodules, by their old flat names.
MODULES_BEFORE = [
    "accumulate", "batch_size", "choices", "data", "diagnose", "distribute", "doctor", "errors",
    "io", "keras", "launch", "memory", "models", "monitor", "precision", "prune", "quantize",
    "quiet", "report", "resume", "schedules", "sparsity", "summaries", "tflite", "training",
]


def _modules():
    """{dotted name: path} of every module in tfaccel/."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def test_every_public_name_of_before_still_resolves():
    missing = [name for name in NAMES_BEFORE if not hasattr(tfaccel, name)]
    assert not missing
    assert set(NAMES_BEFORE) <= set(tfaccel.__all__)
    assert set(NAMES_BEFORE) | set(MODULES_BEFORE) <= set(dir(tfaccel))


@pytest.mark.parametrize("old", MODULES_BEFORE)
def test_old_module_names_are_the_new_modules(old):
    module = importlib.import_module(f"tfaccel.{old}")
    assert module.__name__.startswith("tfaccel.")
    assert module.__name__ in MODULES  # the real module, not a copy under the old name
    assert getattr(tfaccel, old) is module or old == "keras"  # tfaccel.keras is tf_keras itself


def test_no_public_name_is_exported_from_two_modules():
    seen = {}
    for module_name, names in tfaccel._EXPORTS.items():
        for name in names:
            assert name not in seen, f"tfaccel.{name} from {seen[name]} and {module_name}"
            seen[name] = module_name


def test_every_export_lives_where_the_table_says():
    for module_name, names in tfaccel._EXPORTS.items():
        module = importlib.import_module(module_name)
        for name in names:
            value = getattr(module, name)
            home = getattr(value, "__module__", module_name)
            # Defined there (or in the package's own modules), or a constant / the Keras module.
            assert home == module_name or home.startswith(f"{module_name}.") or \
                not callable(value) or name == "keras", (
                f"tfaccel.{name} is exported from {module_name} but defined in {home}")


def test_every_module_is_an_attribute_path_from_a_fresh_import():
    # `tfaccel.compress.tflite_eval.x` must work before anything imported that module.
    paths = sorted(name for name in MODULES
                   if not any(part.startswith("_") for part in name.split(".")))
    code = ("import tfaccel\n"
            f"for path in {paths!r}:\n"
            "    obj = tfaccel\n"
            "    for part in path.split('.')[1:]:\n"
            "        obj = getattr(obj, part)\n"
            "    assert obj.__name__ == path, (path, obj)\n"
            "print(len(" + repr(paths) + "))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == str(len(paths))


def test_launcher_old_module_path_runs():
    result = subprocess.run([sys.executable, "-m", "tfaccel.launch", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "--workers" in result.stdout


# The areas from the ground up: a module may import its own area and the ones below it, never
# one above, at module level or inside a function. A module belongs to the longest prefix that
# names it. docs/architecture.md draws the same order.
LAYERS = (
    ("base", ("tfaccel.errors", "tfaccel.io", "tfaccel.choices", "tfaccel.quiet",
              "tfaccel.doctor", "tfaccel._aliases")),
    ("keras", ("tfaccel.keras",)),
    ("compat", ("tfaccel._compat",)),
    ("bridge", ("tfaccel.keras.bridge", "tfaccel.keras.translate")),
    ("distribute", ("tfaccel.distribute",)),
    ("data", ("tfaccel.data",)),
    ("observability", ("tfaccel.summaries", "tfaccel.plots", "tfaccel.monitor")),
    ("train", ("tfaccel.train",)),
    ("performance", ("tfaccel.performance",)),
    ("compress", ("tfaccel.compress",)),
    ("parallel", ("tfaccel.parallel",)),
    ("cli", ("tfaccel.cli", "tfaccel.__main__", "tfaccel")),
)
DEFERRED = re.compile(r"#.*\bdeferred\b")


def layer_of(module_name):
    """(index, name) of the layer `module_name` belongs to (its longest matching prefix)."""
    best = None
    for index, (name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module_name == prefix or (prefix != "tfaccel"
                                         and module_name.startswith(prefix + ".")):
                if best is None or len(prefix) > best[2]:
                    best = (index, name, len(prefix))
    assert best is not None, f"{module_name} is in no layer: add it to LAYERS"
    return best[:2]


def _imports(module_name, source, modules=None):
    """[(target module, line, inside a function)] of the tfaccel modules `module_name` imports."""
    modules = MODULES if modules is None else modules
    tree = ast.parse(source)
    is_package = modules.get(module_name, pathlib.Path("x.py")).name == "__init__.py"
    package = module_name if is_package else module_name.rpartition(".")[0]
    in_function = {id(sub) for node in ast.walk(tree)
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for sub in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        targets = set()
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in modules else base)
        else:
            continue
        # Importing a.b.c first runs a/__init__ and a/b/__init__ (except the importer's own
        # packages, which are already running when it is imported).
        own = {".".join(module_name.split(".")[:i]) for i in range(1, module_name.count(".") + 1)}
        for target in list(targets):
            parts = target.split(".")
            targets.update(".".join(parts[:i]) for i in range(1, len(parts)))
        for target in sorted(targets):
            if target in modules and target != module_name and target not in own:
                found.append((target, node.lineno, id(node) in in_function))
    return found


def _graph():
    return {name: {t for t, _, _ in _imports(name, path.read_text())}
            for name, path in MODULES.items()}


def upward_imports(sources, modules=None):
    """'importer:line -> target' for each import of a higher layer in `sources` {module: text}."""
    found = []
    for name, source in sorted(sources.items()):
        for target, line, inside in _imports(name, source, modules):
            if layer_of(target)[0] > layer_of(name)[0]:
                found.append(f"{name}:{line} ({layer_of(name)[1]}) imports {target} "
                             f"({layer_of(target)[1]}){' inside a function' if inside else ''}")
    return found


def undeferred_function_imports(source):
    """Lines of imports inside functions with no comment saying which heavy dependency they defer
    (`# deferred: <what>` on the import's first line or the line above it)."""
    lines = source.splitlines()
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    around = lines[sub.lineno - 1] + " " + lines[sub.lineno - 2]
                    if not DEFERRED.search(around):
                        found.append(sub.lineno)
    return sorted(set(found))


def test_every_module_is_in_a_layer():
    for name in MODULES:
        layer_of(name)


PLANTED = {"tfaccel.errors": "pathlib.Path('errors.py')", "tfaccel.data.sources": "",
           "tfaccel.train.models": "", "tfaccel.performance.plan": ""}


def test_upward_import_finder_sees_a_planted_one_at_module_level_and_in_a_function():
    modules = {name: pathlib.Path(name.replace(".", "/") + ".py") for name in PLANTED}
    top = "from tfaccel.train import models\n"
    inside = "def f():\n    from tfaccel.performance.plan import x  # deferred: TensorFlow\n"
    down = "from tfaccel.errors import ConfigError\n\ndef g():\n    import tfaccel.data.sources\n"
    found = upward_imports({"tfaccel.data.sources": top, "tfaccel.train.models": inside + down},
                           modules)
    assert found == ["tfaccel.data.sources:1 (data) imports tfaccel.train.models (train)",
                     "tfaccel.train.models:2 (train) imports tfaccel.performance.plan "
                     "(performance) inside a function"]


def test_no_module_imports_a_higher_layer():
    sources = {name: path.read_text() for name, path in MODULES.items()}
    assert upward_imports(sources) == []


def test_deferred_import_finder():
    source = ("import os\n\ndef f():\n    import json\n    # deferred: TensorFlow\n"
              "    import tensorflow as tf\n    import numpy  # deferred: numpy\n")
    assert undeferred_function_imports(source) == [4]


def test_imports_inside_functions_only_defer_heavy_dependencies():
    offenders = {name: lines for name, path in MODULES.items()
                 if (lines := undeferred_function_imports(path.read_text()))}
    assert offenders == {}


def test_no_library_module_imports_the_recipes_or_benchmarks():
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""]
                assert not any(n.split(".")[0] in ("recipes", "benchmarks") for n in names), name


def _cycles(graph):
    """Every cycle of `graph` as a list of module names (Tarjan's strongly connected components)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_inside_tfaccel():
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("path", sorted([*PACKAGE.rglob("*.py"), *(ROOT / "recipes").glob("*.py")]),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_small_enough_to_read_in_one_sitting(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines"


FOREIGN_PRIVATE_MODULES = ("tensorflow.python", "tensorflow.lite.python", "tf_keras.src",
                           "keras.src", "tensorflow_model_optimization.python")
FOREIGN_PACKAGES = ("tensorflow", "tf_keras", "keras", "tensorflow_model_optimization", "tflite",
                    "ai_edge_litert")
OUR_NAMES = {"self", "cls"}
PRIVATE_CLASS_NAME = re.compile(r"^_[A-Z]\w+$")


def private_touchpoints(source, filename="<source>"):
    """(line, what) for each reach into a private part of another library in `source`."""
    found = []
    tree = ast.parse(source, filename)
    module_name_checks = {node.lineno for node in ast.walk(tree)
                          if isinstance(node, ast.Attribute) and node.attr == "__module__"}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = ([node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
                     if isinstance(node, ast.ImportFrom) else [a.name for a in node.names])
            for name in names:
                if name.startswith(FOREIGN_PRIVATE_MODULES):
                    found.append((node.lineno, f"import {name}"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # A module path or a private class name compared as a string.
            value = node.value
            if value.startswith(FOREIGN_PRIVATE_MODULES) or PRIVATE_CLASS_NAME.match(value) or (
                    value.startswith(FOREIGN_PACKAGES) and node.lineno in module_name_checks):
                found.append((node.lineno, repr(value)))
        elif isinstance(node, ast.Attribute):
            text = ast.unparse(node)
            if node.attr in ("src", "python", "__internal__"):
                found.append((node.lineno, text))
            elif node.attr.startswith("_") and not node.attr.startswith("__") and not (
                    isinstance(node.value, ast.Name) and node.value.id in OUR_NAMES):
                found.append((node.lineno, text))
            elif text.startswith(("tf.compat.v1", "tensorflow.compat.v1")):
                found.append((node.lineno, text))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                "getattr", "hasattr", "setattr"):
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and \
                    str(node.args[1].value).startswith(("_", "src", "python")):
                found.append((node.lineno, ast.unparse(node)))
    by_line = {}  # one finding per line: the longest expression (a.b._c, not also a.b)
    for line, what in found:
        if len(what) > len(by_line.get(line, "")):
            by_line[line] = what
    return sorted(by_line.items())


def test_private_touchpoint_finder_sees_each_kind():
    source = ("from tensorflow.python.distribute import x\n"
              "import tensorflow_model_optimization.python.core as c\n"
              "n = strategy.extended._num_workers\n"
              "s = getattr(model, '_is_graph_network', False)\n"
              "k = keras.src.saving.serialization_lib\n"
              "g = tf.compat.v1.Session\n"
              "from tf_keras import src\n"
              "q = type(layer).__module__.startswith('tensorflow_model_optimization')\n"
              "d = names.get('_DefaultDistributionStrategy')\n"
              "i = importlib.import_module('tf_keras.src.engine')\n"
              "m = K.src.engine\n"
              "h = getattr(keras, 'src')\n"
              "ok = self._writer\n"
              "fine = {'tensorflow': 1}\n")
    found = dict(private_touchpoints(source))
    assert sorted(found) == list(range(1, 13)), found
    assert "self._writer" not in found


def _our_modules_with_private_touchpoints():
    paths = [*PACKAGE.rglob("*.py"), *(ROOT / "recipes").glob("*.py")]
    return {str(p.relative_to(ROOT)): private_touchpoints(p.read_text(), str(p))
            for p in paths if "_compat" not in p.parts}


def test_private_internals_only_in_compat():
    offenders = {path: found for path, found in _our_modules_with_private_touchpoints().items()
                 if found}
    assert offenders == {}


def test_no_class_outside_compat_overrides_a_private_method_of_another_library():
    overrides = []
    for name in MODULES:
        if name.startswith("tfaccel._compat") or name.endswith("__main__"):
            continue
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if not isinstance(cls, type) or cls.__module__ != name:
                continue
            foreign = [base for base in cls.__mro__[1:]
                       if not base.__module__.startswith("tfaccel") and base is not object]
            for attr in vars(cls):
                if attr.startswith("_") and not attr.startswith("__") and \
                        attr != "_abc_impl" and any(attr in vars(base) for base in foreign):
                    overrides.append(f"{name}.{cls.__name__}.{attr}")
    assert overrides == []


def test_no_class_built_inside_a_function_outside_compat_defines_a_private_method():
    """The check above sees module-level classes only; a class built on first call (over a
    Keras that must not load at import) is read from the source, and may not define `_x`
    methods at all, since its bases are not known until it is built."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "_compat" in path.parts:
            continue
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for cls in ast.walk(function):
                if isinstance(cls, ast.ClassDef):
                    found += [f"{path.relative_to(ROOT)}:{item.lineno}: {cls.name}.{item.name}"
                              for item in cls.body if isinstance(item, ast.FunctionDef)
                              and item.name.startswith("_") and not item.name.startswith("__")]
    assert found == []


def test_no_callback_outside_compat_sets_a_private_attribute_of_keras_callbacks():
    from tfaccel.keras import keras

    private = {name for name in vars(keras.callbacks.Callback()) if name.startswith("_")}
    assert "_supports_tf_logs" in private  # what the check looks for exists
    found = []
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "recipes").glob("*.py")]:
        if "_compat" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
