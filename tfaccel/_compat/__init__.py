"""Every place tfaccel relies on a private part of TensorFlow, tf_keras, TF-MOT or TFLite.

Public APIs do not offer these; each is wrapped here in one small function so
that an upgrade is checked and fixed in this one file. Each names what it
relies on and the versions it was checked against (TF 2.21, tf_keras 2.21,
TF-MOT 0.8.1, unless it says otherwise). Imports are lazy: importing this
package loads nothing heavy. One module per area of tfaccel: graphs (model
graphs, shared), distribute (tf.distribute, tf.data), parallel (stage splits),
training (the tf_keras training loop, mixed precision, the allocator), compress (TF-MOT, TFLite),
callbacks (tf_keras callbacks); use them through this package (`_compat.x`).
"""

from tfaccel._compat.callbacks import (
    keras3_backup_writing_whole_files,
    takes_logs_as_tensors,
    tensorboard_without_learning_rate,
)
from tfaccel._compat.compress import (
    layer_calls,
    mask_in_float32,
    no_op_quantize_config,
    prune_registry_supports,
    prune_registry_weight_names,
    pruning_wrapper_class,
    replay_layers,
    tflite_converter_errors,
    tflite_op_outputs,
    unsafe_deserialization,
)
from tfaccel._compat.distribute import (
    num_workers,
    serialized_dataset_graph,
    strategy_name,
)
from tfaccel._compat.graphs import (
    graph_float_ops,
    is_graph_network,
    is_plain_graph_model,
    sublayers,
)
from tfaccel._compat.keras3 import (
    is_keras3_functional,
    keras3_operations,
    keras_hub_seeded_cache,
    last_learning_rate,
)
from tfaccel._compat.parallel import (
    builds_on,
    graph_calls,
    run_call,
)
from tfaccel._compat.training import (
    latest_backup,
    onednn_in_use,
    output_layers,
    restored_backup,
    resumed_start,
    steps_per_execution,
    traced_allocator_names,
    train_counter,
)

__all__ = [
    "keras3_backup_writing_whole_files",
    "graph_float_ops",
    "is_graph_network",
    "is_plain_graph_model",
    "sublayers",
    "num_workers",
    "strategy_name",
    "serialized_dataset_graph",
    "output_layers",
    "restored_backup",
    "resumed_start",
    "latest_backup",
    "onednn_in_use",
    "steps_per_execution",
    "train_counter",
    "traced_allocator_names",
    "pruning_wrapper_class",
    "prune_registry_supports",
    "prune_registry_weight_names",
    "mask_in_float32",
    "layer_calls",
    "replay_layers",
    "no_op_quantize_config",
    "unsafe_deserialization",
    "tflite_op_outputs",
    "tflite_converter_errors",
    "tensorboard_without_learning_rate",
    "takes_logs_as_tensors",
    "is_keras3_functional",
    "keras3_operations",
    "keras_hub_seeded_cache",
    "last_learning_rate",
    "graph_calls",
    "run_call",
    "builds_on",
]
