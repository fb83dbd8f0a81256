"""Private touchpoints: compress (TF-MOT pruning and quantization, TFLite interpreter)."""

from tfaccel._compat.graphs import is_graph_network
from tfaccel.errors import UnsupportedLayerError


def _tfmot_imported():
    """Imports TF-MOT the one way tfaccel does (`tfaccel.keras.tfmot`: its environment side
    effect undone) before a private module of it is imported here."""
    from tfaccel.keras import tfmot  # deferred: TF-MOT

    tfmot()


def pruning_wrapper_class():
    """TF-MOT's `PruneLowMagnitude`, the wrapper `prune_low_magnitude` puts around a layer.

    tfmot.sparsity.keras exports the function, not the class. Relies on
    `tensorflow_model_optimization.python.core.sparsity.keras.pruning_wrapper`.
    Checked: TF-MOT 0.8.1.
    """
    _tfmot_imported()
    # deferred: TF-MOT
    from tensorflow_model_optimization.python.core.sparsity.keras import pruning_wrapper

    return pruning_wrapper.PruneLowMagnitude


def prune_registry_supports(layer):
    """True when TF-MOT's built-in table knows how to prune `layer` (maybe nothing in it).

    Relies on TF-MOT's private `prune_registry.PruneRegistry.supports`. Checked: TF-MOT 0.8.1.
    """
    _tfmot_imported()
    # deferred: TF-MOT
    from tensorflow_model_optimization.python.core.sparsity.keras import prune_registry

    return prune_registry.PruneRegistry.supports(layer)


def prune_registry_weight_names(layer):
    """Names of the attributes of `layer` TF-MOT's built-in table prunes (e.g. ['kernel']).

    Relies on TF-MOT's private `PruneRegistry._weight_names`. Checked: TF-MOT 0.8.1.
    """
    _tfmot_imported()
    # deferred: TF-MOT
    from tensorflow_model_optimization.python.core.sparsity.keras import prune_registry

    return list(prune_registry.PruneRegistry._weight_names(layer))


def _float32_pruning_class():
    _tfmot_imported()
    # deferred: TF-MOT
    from tensorflow_model_optimization.python.core.sparsity.keras import pruning_impl

    from tfaccel.keras import keras  # deferred: tf_keras (tfaccel.keras loads it)

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


def layer_calls(model):
    """[(layer, [layers feeding that call])] for each layer call in a functional or Sequential
    model's graph ([] for a subclassed one).

    Relies on tf_keras's private `Functional._nodes_by_depth` and its `Node`
    objects (`is_input`, `layer`, `inbound_layers`). Checked: tf_keras 2.21.
    """
    import tensorflow as tf  # deferred: TensorFlow

    return [(node.layer, tf.nest.flatten(node.inbound_layers))
            for nodes in getattr(model, "_nodes_by_depth", {}).values()
            for node in nodes if not node.is_input]


def replay_layers(model, inputs):
    """Calls `model`'s layers on `inputs` in graph order, descending into nested models.

    Returns the flat list of output tensors: the layers of every nested model
    are called one by one, so the result has no nested model. Relies on
    tf_keras's private `Functional._nodes_by_depth`, `_tensor_usage_count` and
    the `Node` API (`flat_input_ids`, `map_arguments`, `flat_output_ids`), as
    Keras's own `Functional._run_internal_graph` does. Checked: tf_keras 2.21.

    Raises:
      UnsupportedLayerError: a nested model is subclassed (it has no graph).
    """
    import tensorflow as tf  # deferred: TensorFlow

    from tfaccel.keras import keras  # deferred: tf_keras (tfaccel.keras loads it)

    if not is_graph_network(model):
        raise UnsupportedLayerError(
            f"nested model {model.name!r} is a subclassed {type(model).__name__} and cannot be "
            "flattened for QAT: build it functionally or as a Sequential with an Input")
    usage = model._tensor_usage_count
    tensors = {}
    for ref, value in zip(model.inputs, inputs):
        tensors[str(id(ref))] = [value] * usage[str(id(ref))]
    for depth in sorted(model._nodes_by_depth, reverse=True):
        for node in model._nodes_by_depth[depth]:
            if node.is_input or any(i not in tensors for i in node.flat_input_ids):
                continue
            args, kwargs = node.map_arguments(tensors)
            if isinstance(node.layer, keras.Model):
                outputs = replay_layers(node.layer, tf.nest.flatten(args))
            else:
                outputs = node.layer(*args, **kwargs)
            for ref_id, value in zip(node.flat_output_ids, tf.nest.flatten(outputs)):
                tensors[ref_id] = [value] * usage[ref_id]
    return [tensors[str(id(ref))].pop() for ref in model.outputs]


def no_op_quantize_config():
    """TF-MOT's `NoOpQuantizeConfig` class: a layer annotated with it keeps its input's scale.

    Relies on TF-MOT's private
    `...quantization.keras.default_8bit.default_8bit_quantize_configs`. Checked: TF-MOT 0.8.1.
    """
    _tfmot_imported()
    # deferred: TF-MOT
    from tensorflow_model_optimization.python.core.quantization.keras.default_8bit import (
        default_8bit_quantize_configs,
    )

    return default_8bit_quantize_configs.NoOpQuantizeConfig


def unsafe_deserialization():
    """A context in which tf_keras rebuilds Lambda layers from their configs (safe mode off).

    tf_keras's public switch is global; this scope is tf_keras's private
    `keras.src.saving.serialization_lib.SafeModeScope`. Checked: tf_keras 2.21.
    """
    from tfaccel.keras import keras  # deferred: tf_keras (tfaccel.keras loads it)

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
    from tensorflow.lite.python.convert_phase import ConverterError  # deferred: TensorFlow

    return (ConverterError, ValueError, RuntimeError, TypeError)
