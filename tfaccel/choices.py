"""The names a flag or an argument may take, in one TensorFlow-free place.

The recipes define their flags from these lists before TensorFlow is imported,
so that a bad flag is reported in a fraction of a second; the modules that act
on a choice (`tfaccel.data`, `tfaccel.train.models`, `tfaccel.distribute`, ...) import
their list from here and re-export it (`tfaccel.DATASETS` is this `DATASETS`).
Nothing here may import TensorFlow, Keras or NumPy.
"""

DATASETS = ("digits", "synthetic", "image_dir", "npz", "tfrecord", "tfds")
MODELS = ("mlp", "cnn", "resnet", "mobilenet_v2")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "rmsprop")
STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "parameter_server",
              "tpu")
CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduce_to_one")
COLLECTIVES = ("auto", "ring", "nccl")
SCHEDULES = ("constant", "step", "piecewise", "exponential", "polynomial", "cosine",
             "cosine_restarts", "one_cycle", "epoch_exponential")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
JIT_CHOICES = ("false", "true", "auto")
ALLOCATORS = ("default", "cuda_malloc_async")
HOST_ALLOCATORS = ("pooled", "malloc")
CACHE_MODES = ("auto", "memory", "none")
ON_BAD_EXAMPLE = ("fail", "skip")
PRUNING_SCHEDULES = ("polynomial", "constant")
PRUNING_POLICIES = ("xnnpack",)
BLOCK_POOLINGS = ("AVG", "MAX")
