"""The names a flag or an argument may take, in one TensorFlow-free place.

The recipes define their flags from these lists before TensorFlow is imported,
so that a bad flag is reported in a fraction of a second; the modules that act
on a choice (`tfaccel.data`, `tfaccel.train.models`, `tfaccel.distribute`, ...) import
their list from here and re-export it (`tfaccel.DATASETS` is this `DATASETS`).
Nothing here may import TensorFlow, Keras or NumPy.
"""

TEXT_DATASETS = ("text",)
TOKENIZERS = ("char", "byte")
# The language model's named sizes (tfaccel.train.gpt, and the memory planner's
# `--gpt_size`): tiny ~0.8M parameters with a character vocabulary, small ~10.7M (nanoGPT's
# Shakespeare-char model), gpt2 GPT-2 small (~124M with its 50,257 tokens), 13b the 13B
# decoder of Megatron / LLaMA-13B's shape (plan it; it trains only on many large GPUs).
GPT_SIZES = {"tiny": {"layers": 4, "heads": 4, "d_model": 128, "context": 64},
             "small": {"layers": 6, "heads": 6, "d_model": 384, "context": 256},
             "gpt2": {"layers": 12, "heads": 12, "d_model": 768, "context": 1024},
             "13b": {"layers": 40, "heads": 40, "d_model": 5120, "context": 2048}}
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
# prune_to_sparsity(method=): TF-MOT's wrappers, tfaccel.compress.magnitude's callback, or
# TF-MOT when it can take the model and magnitude otherwise.
PRUNING_METHODS = ("auto", "tfmot", "native")
PRUNING_POLICIES = ("xnnpack",)
BLOCK_POOLINGS = ("AVG", "MAX")
# tfaccel.parallel.pipeline / stages: how a model is split over devices, how stages balance.
PARALLEL_MODES = ("none", "model", "pipeline")
KERAS_FLAVOURS = ("tf_keras", "keras3")  # tfaccel.keras.FLAVOURS
STAGE_BALANCES = ("parameters", "memory")
