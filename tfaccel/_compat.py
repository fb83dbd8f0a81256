"""Every place tfaccel relies on a private part of TensorFlow, tf_keras, TF-MOT or TFLite.

Public APIs do not offer these; each is wrapped here in one small function so
that an upgrade is checked and fixed in this one file. Each names what it
relies on and the versions it was checked against (TF 2.21, tf_keras 2.21,
TF-MOT 0.8.1, unless it says otherwise). Imports are lazy: importing this
module loads nothing heavy.
"""

# ===== shared (used by several areas)


def is_graph_network(model):
    """True for a Sequential or functional model (a graph of layers), False for a subclassed one.

    Relies on tf_keras's private `Functional._is_graph_network` (Sequential is a
    Functional once built). Checked: tf_keras 2.21.
    """
    from tfaccel.keras import keras

    return isinstance(model, keras.Sequential) or bool(getattr(model, "_is_graph_network", False))


# ===== distribute and data (tf.distribute, tf.data)


def num_workers(strategy):
    """Worker processes training together under `strategy` (1 unless multi-worker).

    Relies on the private `strategy.extended._num_workers` (set by the multi-worker and
    parameter-server strategies, absent from the others). Checked: TF 2.21.
    """
    return int(getattr(strategy.extended, "_num_workers", 1) or 1)


def strategy_name(strategy):
    """The name users know `strategy` by: 'default', or its `tf.distribute` class name.

    Relies on the private class name of the default strategy,
    `_DefaultDistributionStrategy`, and on `tf.distribute.MultiWorkerMirroredStrategy`
    being the class `CollectiveAllReduceStrategy`. Checked: TF 2.21.
    """
    public = {"_DefaultDistributionStrategy": "default",
              "CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy"}
    return public.get(type(strategy).__name__, type(strategy).__name__)


def serialized_dataset_graph(dataset):
    """The serialized `GraphDef` (bytes) of `dataset`: what tf.data's auto-shard rewrite reads.

    Relies on the private `tf.data.Dataset._as_serialized_graph()`. Checked: TF 2.21.
    """
    return dataset._as_serialized_graph().numpy()


# ===== performance and train (tf_keras training loop, mixed precision, allocator)


def output_layers(model):
    """The layers whose outputs are `model`'s outputs: the last one of a Sequential.

    Relies on tf_keras's private `Functional._output_layers` ([] for a
    subclassed model). Checked: tf_keras 2.21.
    """
    from tfaccel.keras import keras

    if isinstance(model, keras.Sequential):
        return [model.layers[-1]]
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


def latest_backup(backup_dir):
    """(checkpoint, epoch, batch) of the last backup `BackupAndRestore` wrote to `backup_dir`.

    Read without a model; None when there is none. Epoch and batch as in
    `restored_backup`. Relies on tf_keras's `WorkerTrainingState` layout: the
    chief's checkpoints in `<backup_dir>/chief`, its counters saved as
    `ckpt_saved_epoch` and `ckpt_saved_batch`. Checked: tf_keras 2.21.
    """
    import os

    import tensorflow as tf

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
    import tensorflow as tf

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


# ===== compress (TF-MOT pruning and quantization, TFLite interpreter)


def pruning_wrapper_class():
    """TF-MOT's `PruneLowMagnitude`, the wrapper `prune_low_magnitude` puts around a layer.

    tfmot.sparsity.keras exports the function, not the class. Relies on
    `tensorflow_model_optimization.python.core.sparsity.keras.pruning_wrapper`.
    Checked: TF-MOT 0.8.1.
    """
    from tensorflow_model_optimization.python.core.sparsity.keras import pruning_wrapper

    return pruning_wrapper.PruneLowMagnitude


def prune_registry_supports(layer):
    """True when TF-MOT's built-in table knows how to prune `layer` (maybe nothing in it).

    Relies on TF-MOT's private `prune_registry.PruneRegistry.supports`. Checked: TF-MOT 0.8.1.
    """
    from tensorflow_model_optimization.python.core.sparsity.keras import prune_registry

    return prune_registry.PruneRegistry.supports(layer)


def prune_registry_weight_names(layer):
    """Names of the attributes of `layer` TF-MOT's built-in table prunes (e.g. ['kernel']).

    Relies on TF-MOT's private `PruneRegistry._weight_names`. Checked: TF-MOT 0.8.1.
    """
    from tensorflow_model_optimization.python.core.sparsity.keras import prune_registry

    return list(prune_registry.PruneRegistry._weight_names(layer))


def _float32_pruning_class():
    from tensorflow_model_optimization.python.core.sparsity.keras import pruning_impl

    from tfaccel.keras import keras

    autocast = keras.src.mixed_precision.autocast_variable

    class Float32Pruning(pruning_impl.Pruning):
        """TF-MOT's pruning ops with mixed precision variables read in float32.

        Inside a layer's call, AutoCastVariables read as float16/bfloat16, so
        TF-MOT masks half-precision copies and assigns them back to the float32
        variables: a dtype error under MirroredStrategy (TF-MOT issue #409) and
        master weights rounded to half precision at every step without one.
        """

        def weight_mask_op(self):
            with autocast.enable_auto_cast_variables(None):
                return super().weight_mask_op()

        def conditional_mask_update(self):
            with autocast.enable_auto_cast_variables(None):
                return super().conditional_mask_update()

    return Float32Pruning


_FLOAT32_PRUNING = []


def mask_in_float32(wrapper):
    """Makes a built `PruneLowMagnitude` wrapper compute and apply its masks in float32.

    Replaces its `pruning_obj` (before the first trace) by a subclass of
    TF-MOT's `pruning_impl.Pruning` that reads AutoCastVariables as float32,
    rebuilt from the old object's six private attributes (`_step_fn`,
    `_pruning_vars`, `_pruning_schedule`, `_block_size`, `_block_pooling_type`,
    `_sparsity_m_by_n`); relies on tf_keras's private
    `keras.src.mixed_precision.autocast_variable.enable_auto_cast_variables`.
    A no-op on a wrapper not built yet or already swapped.
    Checked: tf_keras 2.21 / TF-MOT 0.8.1.
    """
    if not _FLOAT32_PRUNING:
        _FLOAT32_PRUNING.append(_float32_pruning_class())
    cls = _FLOAT32_PRUNING[0]
    old = wrapper.pruning_obj
    if old is not None and not isinstance(old, cls):
        wrapper.pruning_obj = cls(
            training_step_fn=old._step_fn, pruning_vars=old._pruning_vars,
            pruning_schedule=old._pruning_schedule, block_size=old._block_size,
            block_pooling_type=old._block_pooling_type, sparsity_m_by_n=old._sparsity_m_by_n)
    return wrapper


def nodes_by_depth(model):
    """{depth: [Node]} of a functional or Sequential model's graph ({} for a subclassed one).

    Relies on tf_keras's private `Functional._nodes_by_depth`. Checked: tf_keras 2.21.
    """
    return dict(getattr(model, "_nodes_by_depth", {}))


def tensor_usage_count(model):
    """{str(id(tensor)): how many layer calls of `model` consume it}, for replaying its graph.

    Relies on tf_keras's private `Functional._tensor_usage_count`. Checked: tf_keras 2.21.
    """
    return model._tensor_usage_count


def no_op_quantize_config():
    """TF-MOT's `NoOpQuantizeConfig` class: a layer annotated with it keeps its input's scale.

    Relies on TF-MOT's private
    `...quantization.keras.default_8bit.default_8bit_quantize_configs`. Checked: TF-MOT 0.8.1.
    """
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_configs,
    )

    return default_8bit_quantize_configs.NoOpQuantizeConfig


def unsafe_deserialization():
    """A context in which tf_keras rebuilds Lambda layers from their configs (safe mode off).

    tf_keras's public switch is global; this scope is tf_keras's private
    `keras.src.saving.serialization_lib.SafeModeScope`. Checked: tf_keras 2.21.
    """
    from tfaccel.keras import keras

    return keras.src.saving.serialization_lib.SafeModeScope(False)


def tflite_op_outputs(interpreter):
    """Indices of the tensors some op of a TFLite/LiteRT interpreter writes (the activations).

    Relies on the interpreter's private `_get_ops_details()`. Checked: TF 2.21 and
    ai-edge-litert's Interpreter.
    """
    return {i for op in interpreter._get_ops_details() for i in op["outputs"]}


def tflite_converter_errors():
    """The exception classes `TFLiteConverter.convert()` raises for a model it cannot convert.

    `ConverterError` is importable only from `tensorflow.lite.python.convert_phase`.
    Checked: TF 2.21.
    """
    from tensorflow.lite.python.convert_phase import ConverterError

    return (ConverterError, ValueError, RuntimeError, TypeError)


# ===== summaries and monitor (tf_keras TensorBoard callback)


_TENSORBOARD_WITHOUT_LR = []


def tensorboard_without_learning_rate():
    """Keras's TensorBoard callback class, subclassed to log no `epoch_learning_rate` scalar.

    Built once, on first call (so that importing this module loads no Keras).
    Relies on tf_keras's private hook `TensorBoard._collect_learning_rate(logs)`,
    which `on_epoch_end` calls to add the schedule's value to the epoch's logs;
    the override returns `logs` unchanged. If a later tf_keras drops the hook
    the curve comes back (tests/test_summaries.py checks it is absent).
    Checked: tf_keras 2.21.
    """
    if not _TENSORBOARD_WITHOUT_LR:
        from tfaccel.keras import keras

        class TensorBoardWithoutLearningRate(keras.callbacks.TensorBoard):
            def _collect_learning_rate(self, logs):
                return logs

        _TENSORBOARD_WITHOUT_LR.append(TensorBoardWithoutLearningRate)
    return _TENSORBOARD_WITHOUT_LR[0]


def takes_logs_as_tensors(callback):
    """Tells Keras that `callback` never reads batch logs as NumPy, so steps need not wait.

    Keras's CallbackList converts each batch's logs to NumPy (which waits for
    the step's results) unless every callback with batch hooks sets tf_keras's
    private `Callback._supports_tf_logs`; a monitor that does not read the logs
    sets it so as not to slow the steps it measures. Checked: tf_keras 2.21.
    """
    callback._supports_tf_logs = True
    return callback
