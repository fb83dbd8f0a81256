"""Private touchpoints: performance and train (tf_keras training loop, mixed precision,
the host allocator)."""
import os

from tfaccel._compat.keras3 import is_keras3_functional


def output_layers(model):
    """The layers whose outputs are `model`'s outputs: the last one of a Sequential.

    Relies on tf_keras's private `Functional._output_layers` ([] for a
    subclassed model); for Keras 3 on the private `KerasTensor._keras_history`.
    Checked: tf_keras 2.21, Keras 3.15.
    """
    from tfaccel.keras import flavour_of, keras_of  # deferred: tf_keras (tfaccel.keras loads it)

    if isinstance(model, keras_of(model).Sequential):
        return [model.layers[-1]]
    if flavour_of(model) == "keras3":  # the operation that made each output

        return ([t._keras_history.operation for t in model.outputs]
                if is_keras3_functional(model) else [])
    return list(getattr(model, "_output_layers", []))


def restored_backup(model):
    """(checkpoint, epoch, batch) that `BackupAndRestore` restored into `model` as `fit` began.

    `checkpoint` is None on a fresh start (then epoch and batch are None too);
    epoch counts from 0, batch is the last step done, -1 for an end-of-epoch
    backup. Returns None when no `BackupAndRestore` ran its `on_train_begin`
    before. Relies on tf_keras's private `Model._training_state` (the
    `WorkerTrainingState` the callback attaches) and its `_ckpt_saved_epoch` and
    `_ckpt_saved_batch` counters, the ones Keras reads to pick the first epoch.
    Checked: tf_keras 2.21.
    """
    state = getattr(model, "_training_state", None)
    if state is None:
        return None
    latest = state.read_checkpoint_manager.latest_checkpoint
    if latest is None:
        return (None, None, None)
    return (latest, int(state._ckpt_saved_epoch.numpy()), int(state._ckpt_saved_batch.numpy()))


def resumed_start(restored, steps):
    """(epoch from 1, step) where `fit` continues after BackupAndRestore restored a backup.

    `restored` is `restored_backup`'s (checkpoint, epoch, batch); `steps` the steps per
    epoch (None if unknown). Mirrors tf_keras's private rule in
    `worker_training_state.maybe_load_initial_counters_from_ckpt`. Checked: tf_keras 2.21.
    """
    _, epoch, batch = restored
    # An epoch backup resumes at the next epoch, a step backup at the next step (the next
    # epoch after an epoch's last step).
    if batch >= 0 and steps and batch == steps - 1:
        return (epoch + 2, 0)
    if batch >= 0:
        return (epoch + 1, batch + 1)
    return (epoch + 2, 0)


def latest_backup(backup_dir):
    """(checkpoint, epoch, batch) of the last backup `BackupAndRestore` wrote to `backup_dir`.

    Read without a model; None when there is none. Epoch and batch as in
    `restored_backup`. Relies on tf_keras's `WorkerTrainingState` layout: the
    chief's checkpoints in `<backup_dir>/chief`, its counters saved as
    `ckpt_saved_epoch` and `ckpt_saved_batch`. Checked: tf_keras 2.21.
    """

    import tensorflow as tf  # deferred: TensorFlow

    latest = tf.train.latest_checkpoint(os.path.join(os.fspath(backup_dir), "chief"))
    if latest is None:
        return None
    reader = tf.train.load_checkpoint(latest)
    return (latest, int(reader.get_tensor("ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE")),
            int(reader.get_tensor("ckpt_saved_batch/.ATTRIBUTES/VARIABLE_VALUE")))


def steps_per_execution(model):
    """How many train steps one call of a compiled model's `train_function` runs (1 if unset).

    Relies on tf_keras's private `Model._steps_per_execution` variable (set by
    `compile(steps_per_execution=...)`). Checked: tf_keras 2.21.
    """
    spe = getattr(model, "_steps_per_execution", None)
    return int(spe.numpy()) if spe is not None else 1


def train_counter(model):
    """The variable counting `model`'s train steps (None before it has one).

    Relies on tf_keras's private `Model._train_counter`. Checked: tf_keras 2.21.
    """
    return getattr(model, "_train_counter", None)


def traced_allocator_names(device="CPU:0"):
    """Names of the allocators TensorFlow recorded for a one-op step traced on `device`.

    TensorFlow names the allocator it uses only in a traced step's memory
    statistics, which only a tf.compat.v1 `Session` run with `FULL_TRACE`
    returns. The allocator of a device is one per process, shared by graphs and
    eager code, so a fresh graph tells what eager code uses. Checked: TF 2.21.
    """
    import tensorflow as tf  # deferred: TensorFlow

    graph = tf.Graph()
    with graph.as_default(), tf.device(f"/device:{device}"):
        fed = tf.compat.v1.placeholder(tf.float32, (4,))
        doubled = tf.concat([fed, fed], 0)  # a fresh output buffer, never folded or forwarded
    run_metadata = tf.compat.v1.RunMetadata()
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(doubled, {fed: [0.0] * 4}, options=options, run_metadata=run_metadata)
    return [memory.allocator_name for stats in run_metadata.step_stats.dev_stats
            if stats.device.endswith(device) for node in stats.node_stats
            for memory in node.memory]


def onednn_in_use():
    """Whether this process's TensorFlow runs oneDNN's kernels: its own answer, read once.

    `tfaccel.doctor.onednn_enabled` decides it from the CPU and the environment as
    TensorFlow does; this asks TensorFlow (tests check the two agree). Relies on
    `tensorflow.python.util._pywrap_util_port.IsMklEnabled`. Checked: TF 2.21.
    """
    from tensorflow.python.util import _pywrap_util_port  # deferred: TensorFlow

    return bool(_pywrap_util_port.IsMklEnabled())
