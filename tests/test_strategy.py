"""tfaccel.distribute.strategy: strategies from a name, cluster config, default-vs-mirrored
equivalence, and the train recipe's bad-input errors (tests/test_batching.py has the batch
arithmetic, the learning-rate rule and the shard policy).

MirroredStrategy runs over the two logical CPU devices that conftest.py makes.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import NUM_CPU_DEVICES, RECIPES, ROOT

from tfaccel import data, distribute
from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.train import training
from tfaccel.train.models import build_model

CLUSTER_VARS = ("TF_CONFIG", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
                "SLURM_STEP_TASKS_PER_NODE")


@pytest.fixture
def no_cluster(monkeypatch):
    for name in CLUSTER_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("name, cls, replicas", [
    ("default", "default", 1),
    ("one_device", "OneDeviceStrategy", 1),
    ("mirrored", "MirroredStrategy", NUM_CPU_DEVICES),
    ("auto", "MirroredStrategy", NUM_CPU_DEVICES),  # several logical CPUs and no cluster
])
def test_make_strategy_by_name(no_cluster, name, cls, replicas):
    strategy = distribute.make_strategy(name)
    info = distribute.describe(strategy)
    assert info["strategy"] == cls
    assert info["replicas"] == replicas == strategy.num_replicas_in_sync
    assert info["chief"] is True and info["workers"] == 1


@pytest.mark.parametrize("cross_device_ops", ["auto", "reduce_to_one", "hierarchical_copy"])
def test_mirrored_reduction_is_choosable(cross_device_ops):
    strategy = distribute.make_strategy("mirrored", cross_device_ops=cross_device_ops)
    # On CPU devices 'auto' reduces to one device (see strategy._cross_device_ops).
    expected = {"auto": tf.distribute.ReductionToOneDevice,
                "reduce_to_one": tf.distribute.ReductionToOneDevice,
                "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce}[cross_device_ops]
    assert isinstance(strategy.extended._cross_device_ops, expected)
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.5)), axis=None)
    assert float(total) == 1.5 * NUM_CPU_DEVICES


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "horovod"}, "unknown strategy 'horovod'"),
    ({"name": "mirrored", "cross_device_ops": "nccl"}, "needs GPUs"),
    ({"name": "mirrored", "cross_device_ops": "allgather"}, "unknown cross_device_ops"),
    ({"name": "default", "collective": "mpi"}, "unknown collective 'mpi'"),
    ({"name": "tpu"}, "no TPU found"),
    ({"name": "multi_worker"}, "tfaccel launch --workers N"),
    ({"name": "parameter_server"}, "'ps' and 'worker'"),
])
def test_bad_strategy_requests_raise_one_line(no_cluster, kwargs, message):
    with pytest.raises(ConfigError, match=message) as err:
        distribute.make_strategy(**kwargs)
    assert "\n" not in str(err.value)


def test_parse_tf_config_accepts_a_cluster():
    text = json.dumps({"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},
                       "task": {"type": "worker", "index": 1}})
    assert distribute.parse_tf_config(text)["task"]["index"] == 1


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ('{"task": {"type": "worker", "index": 0}}', 'no "cluster"'),
    ('{"cluster": {"worker": ["127.0.0.1"]}, "task": {"type": "worker", "index": 0}}', "host:port"),
    ('{"cluster": {"worker": ["127.0.0.1:99999"]}, "task": {"type": "worker", "index": 0}}',
     "1-65535"),
    ('{"cluster": {"worker": ["127.0.0.1:2222"]}}', 'no "task"'),
    ('{"cluster": {"worker": ["127.0.0.1:2222"]}, "task": {"type": "chief", "index": 0}}',
     "'chief' is not a job"),
    ('{"cluster": {"worker": ["127.0.0.1:2222"]}, "task": {"type": "worker", "index": 1}}',
     "must be 0..0"),
])
def test_malformed_tf_config_names_the_problem(text, message):
    with pytest.raises(ConfigError, match=message) as err:
        distribute.parse_tf_config(text)
    assert "\n" not in str(err.value)


def test_cluster_from_tf_config_and_from_slurm(no_cluster, monkeypatch):
    tf_config = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1:2222",
                                                                 "127.0.0.1:2223"]},
                                          "task": {"type": "worker", "index": 1}})}
    resolver = distribute.cluster_resolver_from_env(tf_config)
    assert resolver.cluster_spec().as_dict() == {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 1)
    assert distribute.resolve_strategy_name("auto", resolver) == "multi_worker"

    slurm = {"SLURM_PROCID": "2", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "node[1-2]",
             "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    for name, value in slurm.items():  # TF's Slurm resolver reads os.environ itself
        monkeypatch.setenv(name, value)
    resolver = distribute.cluster_resolver_from_env(slurm_port_base=3000)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["node1:3000", "node1:3001", "node2:3000", "node2:3001"]}
    assert (resolver.task_type, resolver.task_id) == ("worker", 2)
    assert resolver.num_accelerators() == {"GPU": 0}  # a CPU cluster trains on CPUs
    assert distribute.cluster_resolver_from_env({}) is None


def test_split_cpu_checks_its_argument():
    with pytest.raises(ConfigError, match="cpu_devices=0 must be at least 1"):
        distribute.split_cpu(0)
    # conftest already split the CPU: the same count is accepted, another is refused.
    assert len(distribute.split_cpu(NUM_CPU_DEVICES)) == NUM_CPU_DEVICES
    with pytest.raises(ConfigError, match="already initialized 2"):
        distribute.split_cpu(3)


def _train(strategy, epochs=2):
    """Weights before and after plain-SGD training of a dropout-free MLP (4 steps per epoch)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 6, 6, 1)).astype(np.float32)
    y = rng.integers(0, 4, size=256)
    ds = data.batch_dataset(tf.data.Dataset.from_tensor_slices((x, y)), 64, training=False)
    ds = distribute.with_shard_policy(ds, in_memory=True)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build_model("mlp", (6, 6, 1), 4, hidden=(32,), dropout=0)
        training.compile_classifier(model, training.make_optimizer("sgd", 0.5))
    before = [w.copy() for w in model.get_weights()]
    model.fit(ds, epochs=epochs, verbose=0)
    return before, model.get_weights()


@pytest.mark.parametrize("cross_device_ops", ["auto", "hierarchical_copy"])  # auto: reduce_to_one
def test_mirrored_training_matches_default(cross_device_ops):
    init_default, default = _train(distribute.make_strategy("default"))
    init_mirrored, mirrored = _train(distribute.make_strategy("mirrored",
                                                              cross_device_ops=cross_device_ops))
    for a, b in zip(init_default, init_mirrored):
        np.testing.assert_array_equal(a, b)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(default, init_default))
    assert moved > 1e-2, "training did not change the weights: the comparison would be empty"
    print(f"mirrored ({cross_device_ops}) vs default: largest weight difference",
          max(float(np.abs(a - b).max()) for a, b in zip(default, mirrored)), "after 8 steps")
    for a, b in zip(default, mirrored):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _recipe_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


# Every case is also checked in-process above; these show the recipe turns each into one
# 'error:' line (whole, or the part given for TF_CONFIG's JSON error, whose wording is
# Python's), exit code 2 and no files. They need the environment or the devices, so they come
# once TensorFlow has loaded (~10 CPU-seconds each): two cases run in the fast suite, one is
# marked slow. The flags alone (--cpu_devices=0, --strategy=horovod, --backup_freq=hourly)
# are refused as they are parsed: tests/test_bad_inputs.py.
BAD_RECIPE_INPUTS = {
    "multi_worker alone": (["--strategy=multi_worker"], {}, "error: strategy 'multi_worker' "
                           "needs a cluster and found no TF_CONFIG: run it under `tfaccel launch "
                           "--workers N -- <command>` on one machine, or set TF_CONFIG (or run "
                           "under Slurm) on a cluster"),
    "indivisible batch": (["--strategy=mirrored", "--cpu_devices=2", "--batch_size=65"], {},
                          "error: batch_size=65 is the global batch and must be a multiple of "
                          "the 2 replicas: use 64 or 66"),
}
MORE_BAD_RECIPE_INPUTS = {
    "malformed TF_CONFIG": (["--strategy=multi_worker"], {"TF_CONFIG": '{"cluster": '},
                            "TF_CONFIG="),
}


def _check_bad_inputs(cases, tmp_path):
    procs = {}
    for i, (name, (args, env, _)) in enumerate(cases.items()):
        model_dir = tmp_path / f"run{i}"
        procs[name] = (model_dir, subprocess.Popen(
            [sys.executable, os.path.join(RECIPES, "train.py"), f"--model_dir={model_dir}",
             "--epochs=1", *args], env=_recipe_env(**env), cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for name, (model_dir, proc) in procs.items():
        _, err = proc.communicate(timeout=300)
        message = cases[name][2]
        assert proc.returncode == 2, (name, err[-2000:])
        assert len(err.splitlines()) == 1 and err.startswith("error: "), (name, err[-2000:])
        line = err.splitlines()[0]
        assert line == message if message.startswith("error: ") else message in line, (name, line)
        assert "Traceback" not in err, name
        assert not model_dir.exists(), f"{name}: wrote {model_dir} despite bad input"


def test_train_recipe_rejects_bad_distribution_input(tmp_path):
    _check_bad_inputs(BAD_RECIPE_INPUTS, tmp_path)


@pytest.mark.slow
def test_train_recipe_rejects_more_bad_distribution_input(tmp_path):
    _check_bad_inputs(MORE_BAD_RECIPE_INPUTS, tmp_path)


def test_a_second_mirrored_strategy_in_the_process_trains():
    # TensorFlow's default CPU reduction (collective ops) fails here with "Shape mismatch in the
    # collective instance 100" for the second model: make_strategy must avoid that.
    for units in (3, 50):
        strategy = distribute.make_strategy("mirrored")
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units)])
            model.compile(keras.optimizers.SGD(0.1), "mse")
        history = model.fit(np.ones((8, 4), np.float32), np.ones((8, units), np.float32),
                            batch_size=4, epochs=2, verbose=0)
        assert history.history["loss"][1] < history.history["loss"][0]
