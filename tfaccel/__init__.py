"""tfaccel: make TensorFlow/Keras training faster and lighter, and trained models smaller.

Helpers, each usable alone in your own tf_keras code; the recipes in
`recipes/` drive the same helpers from flags. Names are loaded on first use,
so ``import tfaccel`` is instant and `tfaccel launch` needs no TensorFlow.

Example:

    import tfaccel

    splits = tfaccel.load_dataset("digits")
    model = tfaccel.build_model("cnn", splits.info.input_shape, splits.info.num_classes)
    tfaccel.compile_classifier(model, tfaccel.make_optimizer("adam", 1e-3))
    model.fit(tfaccel.build_pipeline(splits.train, tfaccel.PipelineConfig(batch_size=64),
                                     training=True, info=splits.info), epochs=5)
"""

import importlib

from tfaccel import _aliases
from tfaccel.errors import (
    ConfigError as ConfigError,
    DataError as DataError,
    ModelError as ModelError,
    TfaccelError as TfaccelError,
    TrainingError as TrainingError,
    UnsupportedLayerError as UnsupportedLayerError,
    WrongKerasError as WrongKerasError,
)

__version__ = "0.1.0"

# Public name -> the module that defines it.
_EXPORTS = {
    "tfaccel.keras": ["keras", "ensure_tf_keras", "is_keras3_object", "flavour_of", "keras3",
                      "keras_of"],
    "tfaccel.keras.bridge": ["to_tf_keras", "to_keras3", "untranslatable_layers", "max_difference"],
    "tfaccel.data": [
        "DATASETS", "DatasetInfo", "Splits", "PipelineConfig", "load_dataset",
        "load_digits", "load_synthetic", "load_image_dir", "load_npz", "load_tfrecord",
        "load_tfds", "from_arrays", "batch_dataset", "build_pipeline", "build_splits",
        "steps_per_epoch", "write_image_tfrecords",
    ],
    "tfaccel.data.text": [
        "TextSplits", "Vocabulary", "build_vocabulary", "load_vocabulary", "load_text_dataset",
        "read_corpus",
    ],
    "tfaccel.data.text_pipeline": ["text_dataset"],
    "tfaccel.train.models": ["MODELS", "build_model", "load_model_file", "resolve_model"],
    "tfaccel.train.gpt": [
        "GPTConfig", "GPT_SIZES", "gpt_config", "build_gpt", "gpt_config_of", "with_recompute",
    ],
    "tfaccel.train.generate": ["generate", "generate_tokens", "export_language_model",
                               "load_language_model"],
    "tfaccel.train.language_model": [
        "compile_language_model", "LanguageModelMetrics", "SampleLogger",
    ],
    "tfaccel.train.causal_lm": ["keras_hub_gpt2", "language_model_from_fn"],
    "tfaccel.train.training": [
        "make_optimizer", "compile_classifier", "evaluate", "export_model",
        "StopOnNonFiniteLoss", "read_finished_run",
    ],
    "tfaccel.train.schedules": [
        "SCHEDULES", "make_schedule", "ConstantSchedule",
        "StepSchedule", "PiecewiseSchedule", "ExponentialSchedule", "PolynomialSchedule",
        "CosineSchedule", "CosineRestartsSchedule", "OneCycleSchedule",
        "EpochExponentialSchedule",
    ],
    "tfaccel.train.resume": [
        "backup_callbacks", "ResumeReporter", "EpochCounter", "read_backup",
        "remove_backup",
    ],
    "tfaccel.summaries": [
        "read_scalars", "read_text_summaries", "read_image_tags", "ScalarLogger",
        "ThroughputLogger", "LearningRateLogger", "tensorboard_command", "TensorBoard",
        "read_text",  # deprecated (warns): what tfaccel.read_text was, read_text_summaries
    ],
    "tfaccel.distribute.strategy": ["STRATEGIES", "make_strategy", "split_cpu"],
    "tfaccel.parallel.stages": ["plan_stages", "StagePlan", "Stage"],
    "tfaccel.parallel.pipeline": [
        "pipeline_parallel", "model_parallel", "PipelineModel", "parallel_devices",
    ],
    "tfaccel.distribute.batching": [
        "per_replica_batch_size", "scale_learning_rate", "with_shard_policy", "worker_output_dir",
    ],
    "tfaccel.train.precision": [
        "PRECISIONS", "set_precision", "precision_scope", "apply_precision",
        "wrap_optimizer", "scaled_gradients", "precision_advice", "layer_dtypes",
    ],
    "tfaccel.performance.trials": ["auto_select", "choose_fastest"],
    "tfaccel.performance.batch_search": ["find_batch_size", "search_batch_size"],
    "tfaccel.performance.accumulate": ["enable_gradient_accumulation"],
    "tfaccel.performance.utilization": [
        "training_flops_per_example", "transformer_flops_per_token", "mfu",
    ],
    "tfaccel.performance.step_profile": ["ProfileSteps", "op_times", "traced_allocator_peak",
                                         "allocator_peak", "allocation_events"],
    "tfaccel.performance.memory_pool": ["PoolSimulator", "replay_allocations"],
    "tfaccel.performance.plan": ["plan_memory", "MemoryPlan", "format_plan", "PlanSettings"],
    "tfaccel.performance.memory_profile": ["profile_transformer", "MemoryProfile"],
    "tfaccel.performance.memory": [
        "configure_gpu_memory", "use_pooled_host_allocator",
        "pooled_host_allocator_active", "host_allocator", "free_memory", "PeakMemoryLogger",
        "training_peak_bytes", "weights_into_pool",
    ],
    "tfaccel.performance.diagnose": ["diagnose_input", "InputDiagnosis"],
    "tfaccel.monitor": [
        "HardwareMonitor", "time_training", "StepClock", "StepTimes", "time_steps", "time_fit",
    ],
    "tfaccel.compress.pruning_plan": [
        "PruneConfig", "PruningPlan", "plan_pruning", "make_pruning_schedule",
    ],
    "tfaccel.compress.prune": ["prune_to_sparsity", "strip_pruning", "load_pruned_model"],
    "tfaccel.compress.magnitude": ["prune_magnitude", "strip_magnitude", "MagnitudePruning"],
    "tfaccel.compress.prunable": ["plan_kernels"],
    "tfaccel.compress.sparsity": [
        "sparsity_report", "check_m_by_n", "model_sizes", "SparsityLogger",
    ],
    "tfaccel.compress.quantize": [
        "quantize_aware", "check_qat_ready", "check_quantize_aware", "flatten_model",
        "unsupported_layers",
    ],
    "tfaccel.compress.tflite": ["convert_to_tflite"],
    "tfaccel.compress.keras3_quantize": [
        "KERAS3_MODES", "Keras3Variant", "keras3_quantized", "keras3_variant", "keras3_to_tflite",
        "quantized_weights", "keras_weight_sizes", "compare_keras_latency", "gptq_calibrates",
    ],
    "tfaccel.compress.tflite_eval": [
        "evaluate_tflite", "measure_latency", "compare_latency", "tflite_sizes",
        "prediction_agreement", "weight_sparsity",
    ],
    "tfaccel.compress.tflite_lm": ["language_model_tflite", "evaluate_language_model_tflite"],
    "tfaccel.compress.latency": ["compare_latencies"],
    "tfaccel.compress.report": ["write_report", "comparison_rows"],
    "tfaccel.compress.lm_variants": ["parse_lm_variants"],
    "tfaccel.compress.lm_report": ["measure_lm_variants", "write_lm_report", "load_causal_lm"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
# Submodules reachable as attributes: the areas, the top-level modules, and each moved
# module under its old flat name (`tfaccel.precision` is tfaccel.train.precision).
_SUBMODULES = {
    **{name: f"tfaccel.{name}" for name in (
        "data", "train", "performance", "distribute", "compress", "parallel", "errors", "keras",
        "io",
        "summaries", "plots", "monitor", "doctor", "cli", "choices", "quiet")},
    **{old.rpartition(".")[2]: new for old, new in _aliases.MOVED.items()
       if old.count(".") == 1},
}
_aliases.install()

__all__ = sorted(
    [*_WHERE, "ConfigError", "DataError", "ModelError", "TfaccelError", "TrainingError",
     "UnsupportedLayerError", "WrongKerasError"])


def __getattr__(name):
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    else:
        raise AttributeError(f"module 'tfaccel' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
