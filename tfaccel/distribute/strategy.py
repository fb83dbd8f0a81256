"""Data-parallel training from one name: pick a `tf.distribute` strategy and use it safely.

`make_strategy("auto")` gives MirroredStrategy when several GPUs (or several
logical CPU devices, see `split_cpu`) are visible, MultiWorkerMirroredStrategy
when `TF_CONFIG` or Slurm describes a cluster of workers, and the default
strategy otherwise. `num_workers`, `is_chief`, `barrier` and `describe` tell
the code what it runs in; the batch arithmetic, learning-rate scaling,
auto-shard policy and chief-only output that go with a strategy are in
`tfaccel.distribute.batching`.

Example:

    from tfaccel import distribute

    distribute.split_cpu(2)                   # before any TensorFlow op
    strategy = distribute.make_strategy("mirrored")
    per_replica = distribute.per_replica_batch_size(64, strategy.num_replicas_in_sync)  # 32
    with strategy.scope():
        model = build_model("cnn", (8, 8, 1), 10)
        compile_classifier(model, make_optimizer("sgd", 0.1))
    model.fit(distribute.with_shard_policy(train_ds, in_memory=True), epochs=5)
"""

import json
import os

import tensorflow as tf

from tfaccel import _compat
from tfaccel.choices import COLLECTIVES, CROSS_DEVICE_OPS, STRATEGIES, check_cpu_devices
from tfaccel.errors import ConfigError, first_line

__all__ = [
    "STRATEGIES", "LAUNCHER_HINT", "split_cpu", "parse_tf_config", "cluster_resolver_from_env",
    "resolve_strategy_name", "make_strategy", "num_workers", "is_chief", "barrier", "describe",
]


LAUNCHER_HINT = ("run it under `tfaccel launch --workers N -- <command>` on one machine, or set "
                 "TF_CONFIG (or run under Slurm) on a cluster")


def split_cpu(num_devices):
    """Splits the physical CPU into `num_devices` logical devices, so mirrored code runs
    without GPUs.

    Must run before TensorFlow initializes its devices (before any op or
    tensor is created). Calling it again with the same count is harmless.

    Args:
      num_devices: 1 or more (1 leaves the CPU whole).

    Returns:
      The names of the logical CPU devices.

    Raises:
      ConfigError: `num_devices` < 1, or devices were already initialized with another count.
    """
    num_devices = check_cpu_devices(num_devices)
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)])
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        if have != num_devices:
            raise ConfigError(f"cpu_devices={num_devices}: TensorFlow already initialized {have} "
                              "CPU device(s); split the CPU before any TensorFlow op runs"
                              ) from None
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def parse_tf_config(text):
    """Parses and checks a `TF_CONFIG` JSON string.

    Args:
      text: the JSON, e.g. '{"cluster": {"worker": ["127.0.0.1:2222", ...]},
        "task": {"type": "worker", "index": 0}}'.

    Returns:
      The parsed dict.

    Raises:
      ConfigError: not JSON, no cluster, addresses not "host:port", or a task
        that is not in the cluster.
    """
    where = f"TF_CONFIG={text!r}"
    try:
        config = json.loads(text)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where} is not valid JSON ({e}): set it to "
                          '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", '
                          '"index": i}}') from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not cluster:
        raise ConfigError(f"{where} has no \"cluster\" mapping job names to address lists, e.g. "
                          '{"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}')
    for job, addresses in cluster.items():
        if not isinstance(addresses, list) or not addresses:
            raise ConfigError(f"{where}: cluster job {job!r} must be a non-empty list of "
                              "\"host:port\" addresses")
        for address in addresses:
            host, sep, port = str(address).rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"{where}: address {address!r} of job {job!r} must be "
                                  "\"host:port\" with a port in 1-65535")
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ConfigError(f"{where} has no \"task\" saying which process this is, e.g. "
                          '{"type": "worker", "index": 0}')
    if task["type"] not in cluster:
        raise ConfigError(f"{where}: task type {task['type']!r} is not a job of the cluster "
                          f"({', '.join(cluster)})")
    index = task["index"]
    if not isinstance(index, int) or not 0 <= index < len(cluster[task["type"]]):
        raise ConfigError(f"{where}: task index {index!r} must be "
                          f"0..{len(cluster[task['type']]) - 1} "
                          f"for job {task['type']!r}")
    return config


def _slurm_resolver(environ, port_base):
    """TF's Slurm resolver, re-wrapped so that a CPU-only cluster reports no GPUs."""
    resolvers = tf.distribute.cluster_resolver
    num_tasks = int(environ["SLURM_STEP_NUM_TASKS"])
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    try:
        # With no GPUs, Slurm's resolver would step GPU ids by 0: give it one id per task and
        # report 0 accelerators ourselves so that the strategy uses the CPU.
        resolver = resolvers.SlurmClusterResolver(
            port_base=port_base, gpus_per_node=num_gpus or num_tasks,
            gpus_per_task=None if num_gpus else 1, auto_set_gpu=bool(num_gpus))
        spec = resolver.cluster_spec()
    except (KeyError, RuntimeError, ValueError) as e:
        raise ConfigError(f"cannot resolve the Slurm cluster from SLURM_* variables ({e}): run "
                          "inside `srun`, or set TF_CONFIG instead") from None
    return resolvers.SimpleClusterResolver(
        spec, task_type=resolver.task_type, task_id=resolver.task_id,
        num_accelerators={"GPU": num_gpus}, rpc_layer="grpc")


def cluster_resolver_from_env(environ=None, slurm_port_base=8888):
    """The cluster this process belongs to, from `TF_CONFIG` or else Slurm; None when neither
    is set.

    Args:
      environ: the environment to read (default `os.environ`).
      slurm_port_base: first port of the tasks on each Slurm node.

    Returns:
      A `tf.distribute.cluster_resolver.ClusterResolver`, or None.

    Raises:
      ConfigError: a malformed `TF_CONFIG` or Slurm environment.
    """
    environ = os.environ if environ is None else environ
    text = environ.get("TF_CONFIG", "")
    if text.strip():
        config = parse_tf_config(text)
        if environ is os.environ:  # the resolver TensorFlow's and Keras's own helpers expect
            return tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(config["cluster"]), task_type=config["task"]["type"],
            task_id=config["task"]["index"], rpc_layer=config.get("rpc_layer", "grpc"),
            num_accelerators={"GPU": len(tf.config.list_physical_devices("GPU"))})
    if environ.get("SLURM_PROCID") is not None and int(
            environ.get("SLURM_STEP_NUM_TASKS", "1")) > 1:
        return _slurm_resolver(environ, slurm_port_base)
    return None


def _cluster_size(resolver):
    if resolver is None:
        return 0
    return sum(len(v) for v in resolver.cluster_spec().as_dict().values())


def _mirrored_devices():
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return [d.name for d in gpus]
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def _cross_device_ops(name, devices):
    if name == "auto":
        if any("GPU" in d.upper() for d in devices):
            return None  # TensorFlow's choice: NCCL when it can
        # On CPU devices TensorFlow would pick collective ops, whose instance keys restart with
        # every MirroredStrategy: a second strategy in the same process then fails with
        # "Shape mismatch in the collective instance 100".
        return tf.distribute.ReductionToOneDevice()
    if name == "nccl" and not any("GPU" in d.upper() for d in devices):
        raise ConfigError("cross_device_ops='nccl' needs GPUs and none are visible: use "
                          "'reduce_to_one' (or 'auto') on CPU devices")
    if name == "nccl":
        return tf.distribute.NcclAllReduce()
    if name == "hierarchical_copy":
        return tf.distribute.HierarchicalCopyAllReduce()
    return tf.distribute.ReductionToOneDevice()


def _communication_options(collective, timeout_seconds):
    impl = tf.distribute.experimental.CommunicationImplementation
    if collective == "nccl" and not tf.config.list_physical_devices("GPU"):
        raise ConfigError("collective='nccl' needs GPUs and none are visible: use 'ring' or 'auto'")
    implementation = {"auto": impl.AUTO, "ring": impl.RING, "nccl": impl.NCCL}[collective]
    return tf.distribute.experimental.CommunicationOptions(implementation=implementation,
                                                           timeout_seconds=timeout_seconds)


def resolve_strategy_name(name, resolver=None):
    """What `auto` means here: multi_worker in a cluster, mirrored with several devices,
    else default."""
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {name!r}: use one of {', '.join(STRATEGIES)}")
    if name != "auto":
        return name
    if _cluster_size(resolver) > 1:
        return "multi_worker"
    return "mirrored" if len(_mirrored_devices()) > 1 else "default"


def make_strategy(name="auto", *, cross_device_ops="auto", collective="auto",
                  collective_timeout=None, cluster_resolver=None, tpu=""):
    """Builds a `tf.distribute.Strategy` from its name.

    Names: 'auto' (see `resolve_strategy_name`), 'default', 'one_device' (the
    first GPU, else the CPU), 'mirrored' (all GPUs, else all logical CPU
    devices), 'multi_worker' (MultiWorkerMirroredStrategy; the cluster comes
    from `cluster_resolver`, `TF_CONFIG` or Slurm), 'parameter_server' (this
    process is the coordinator; the cluster needs 'chief', 'worker' and 'ps'
    jobs) and 'tpu'.

    Args:
      name: one of `STRATEGIES`.
      cross_device_ops: reduction of 'mirrored': 'auto' (TensorFlow's choice on GPUs,
        'reduce_to_one' on CPU devices), 'nccl', 'hierarchical_copy', 'reduce_to_one'.
      collective: all-reduce of 'multi_worker': 'auto', 'ring' or 'nccl'.
      collective_timeout: seconds after which a stuck collective fails (None: wait).
      cluster_resolver: overrides `cluster_resolver_from_env()`.
      tpu: TPU name or address for 'tpu' ('' = the local TPU).

    Returns:
      The strategy.

    Raises:
      ConfigError: unknown name or option, a malformed or missing cluster, no TPU.
    """
    # Options of every strategy are checked whichever is picked, so that a typo never goes unseen.
    if cross_device_ops not in CROSS_DEVICE_OPS:
        raise ConfigError(f"unknown cross_device_ops {cross_device_ops!r}: use one of "
                          f"{', '.join(CROSS_DEVICE_OPS)}")
    if collective not in COLLECTIVES:
        raise ConfigError(f"unknown collective {collective!r}: use one of {', '.join(COLLECTIVES)}")
    resolver = cluster_resolver
    if resolver is None and name in ("auto", "multi_worker", "parameter_server"):
        resolver = cluster_resolver_from_env()
    name = resolve_strategy_name(name, resolver)
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        devices = _mirrored_devices()
        return tf.distribute.MirroredStrategy(
            devices, cross_device_ops=_cross_device_ops(cross_device_ops, devices))
    if name == "multi_worker":
        if resolver is None:
            raise ConfigError(f"strategy 'multi_worker' needs a cluster and found no TF_CONFIG: "
                              f"{LAUNCHER_HINT}")
        jobs = resolver.cluster_spec().as_dict()
        if set(jobs) - {"chief", "worker", "evaluator"}:
            raise ConfigError(f"strategy 'multi_worker' takes 'chief' and 'worker' jobs, but the "
                              f"cluster has {sorted(jobs)}: use 'parameter_server' for 'ps' jobs")
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver,
            communication_options=_communication_options(collective, collective_timeout))
    if name == "parameter_server":
        jobs = resolver.cluster_spec().as_dict() if resolver is not None else {}
        if "ps" not in jobs or "worker" not in jobs:
            raise ConfigError(f"strategy 'parameter_server' needs a cluster with 'ps' and 'worker' "
                              f"jobs (got {sorted(jobs) or 'no TF_CONFIG'}): set TF_CONFIG")
        return tf.distribute.experimental.ParameterServerStrategy(resolver)
    # name == "tpu"
    try:
        tpu_resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(tpu_resolver)
        tf.tpu.experimental.initialize_tpu_system(tpu_resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
        raise ConfigError(f"strategy 'tpu': no TPU found ({first_line(e)}): pick another strategy, "
                          "e.g. 'auto'") from None
    return tf.distribute.TPUStrategy(tpu_resolver)


def num_workers(strategy):
    """How many worker processes train together (1 unless multi-worker)."""
    return _compat.num_workers(strategy)


def is_chief(strategy):
    """True in the process that writes logs, checkpoints, exports and reports."""
    return bool(strategy.extended.should_checkpoint)


def barrier(strategy):
    """Returns once every worker has called it (one tiny all-reduce); at once on one worker.

    For a decision one worker acts on and the others must see done, e.g. the chief
    removing a stale backup before every worker's `BackupAndRestore` reads it.
    """
    if num_workers(strategy) <= 1:
        return

    def one():
        return tf.constant(1.0)

    @tf.function  # eager collectives warn of their overhead
    def all_reduce():
        return strategy.reduce("SUM", strategy.run(one), axis=None)

    all_reduce()


def describe(strategy):
    """A dict for reports: strategy class, replicas, workers, this task, chief or not."""
    resolver = getattr(strategy, "cluster_resolver", None)
    task = f"{resolver.task_type}:{resolver.task_id}" \
        if resolver is not None and resolver.task_type else None
    return {"strategy": _compat.strategy_name(strategy),
            "replicas": int(strategy.num_replicas_in_sync),
            "workers": num_workers(strategy), "task": task, "chief": is_chief(strategy)}
