"""GPU memory controls and peak memory per epoch.

TensorFlow grabs nearly all GPU memory by default. `configure_gpu_memory`
offers its three alternatives: grow on demand (`growth`), a hard cap per GPU
(`limit_mb`), and the `cuda_malloc_async` allocator (CUDA's stream-ordered
memory pool, TensorFlow's answer to "use a memory pool"). All three must be set
before TensorFlow initializes its GPUs, so call it first thing. On a machine
without GPUs they do nothing and say so in a warning.

`use_pooled_host_allocator` serves host (CPU) tensors from TensorFlow's pooled
BFC allocator instead of malloc, which lets parallel input pipelines scale; like
the GPU settings it must come before TensorFlow allocates anything.
`host_allocator` says which allocator is in use: the pool, oneDNN's (the
default on CPUs with AVX512_VNNI, AVX512_BF16 or AMX) or malloc (the default
elsewhere).

`PeakMemoryLogger` logs the peak memory of each epoch to TensorBoard: GPU
peaks from TensorFlow's memory info, else the process's peak resident memory.

Example:

    from tfaccel.performance import memory

    for warning in memory.configure_gpu_memory(growth=True):
        print("warning:", warning)
    model.fit(ds, epochs=3, callbacks=[memory.PeakMemoryLogger("runs/a/logs/train")])
"""

import gc
import os
import re

import psutil
import tensorflow as tf
from absl import logging

from tfaccel import _compat
from tfaccel.choices import (  # noqa: F401 (ALLOCATORS, HOST_ALLOCATORS re-exported)
    ALLOCATORS,
    HOST_ALLOCATORS,
    check_gpu_memory,
)
from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.summaries import EpochScalarLogger

_MB = 1024 * 1024


def configure_gpu_memory(growth=False, limit_mb=None, allocator="default", gpus=None):
    """Sets how TensorFlow allocates GPU memory; call before anything runs on a GPU.

    Args:
      growth: allocate GPU memory as needed instead of all of it up front.
      limit_mb: cap each GPU at this many MB (a logical device of that size).
      allocator: 'default' (TensorFlow's BFC allocator) or 'cuda_malloc_async'.
      gpus: the physical GPUs to configure (default: all visible); for tests.

    Returns:
      A list of warnings (also logged): settings that had no effect, e.g. on a
      machine without GPUs or after TensorFlow already initialized them.

    Raises:
      ConfigError: unknown allocator, `limit_mb` <= 0, or `growth` together
        with `limit_mb` (TensorFlow accepts only one of them per GPU).
    """
    check_gpu_memory(growth, limit_mb, allocator)
    warnings = []
    if allocator != "default":
        # Read by TensorFlow when it creates the GPU devices, so it must be set first.
        os.environ["TF_GPU_ALLOCATOR"] = allocator
    gpus = tf.config.list_physical_devices("GPU") if gpus is None else gpus
    asked = [name for name, on in (("memory growth", growth), (f"a {limit_mb} MB memory limit",
                                                                 limit_mb is not None),
                                   (f"the {allocator} allocator", allocator != "default")) if on]
    if not gpus:
        if asked:
            warnings.append(f"no GPU visible: {' and '.join(asked)} ignored (GPU memory "
                            "settings only apply to GPUs)")
    else:
        try:
            for gpu in gpus:
                if growth:
                    tf.config.experimental.set_memory_growth(gpu, True)
                if limit_mb is not None:
                    tf.config.set_logical_device_configuration(
                        gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=int(limit_mb))])
        except RuntimeError as e:  # "Physical devices cannot be modified after being initialized"
            warnings.append(f"GPU memory settings ignored: TensorFlow already initialized its GPUs "
                            f"({e}); configure memory before building models or datasets")
    for warning in warnings:
        logging.warning("%s", warning)
    return warnings


def use_pooled_host_allocator(limit_mb=None):
    """Serves TensorFlow's host (CPU) tensors from its pooled BFC allocator, not malloc.

    Why: with malloc (TensorFlow's CPU default on CPUs without AVX512_VNNI,
    AVX512_BF16 or AMX; see `host_allocator`), glibc hands out tensor-sized
    buffers (over 128 KB: a 160x160 float image is 300 KB) with mmap and returns
    them with munmap. Every new buffer is page-faulted in and zeroed by the kernel,
    and munmap takes the process's memory-map lock, so parallel input stages stall
    each other. On 2 cores a decode/resize/standardize pipeline spent 15-25% of its
    CPU time in the kernel. With the pool, kernel time fell by 60% and the builder
    ran at 1.6x the serial pipeline instead of 1.3x (benchmarks/bench_data.py,
    which compares both). The pool grows as needed and keeps what it grew to, so
    the peak host memory stays reserved until the process ends.

    It must run before TensorFlow allocates its first tensor; after
    ``import tensorflow`` is fine. It sets ``TF_CPU_ALLOCATOR_USE_BFC``, which
    TensorFlow reads once, when it creates its CPU allocator, and which wins
    over oneDNN's allocator. Check the result with `pooled_host_allocator_active`
    once devices are configured.

    Example:

        from tfaccel.performance import memory

        memory.use_pooled_host_allocator()       # first thing in the program
        ...                                      # split CPUs, GPU memory settings
        assert memory.pooled_host_allocator_active()

    Args:
      limit_mb: cap the pool at this many MB (TensorFlow's default: 64 GB).

    Raises:
      ConfigError: `limit_mb` <= 0.
    """
    if limit_mb is not None and limit_mb <= 0:
        raise ConfigError(f"host memory pool limit {limit_mb} MB must be positive (or unset)")
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
    if limit_mb is not None:
        os.environ["TF_CPU_BFC_MEM_LIMIT_IN_MB"] = str(int(limit_mb))


HOST_ALLOCATOR_KINDS = {"bfc_cpu_allocator_for_gpu": "pooled", "mklcpu": "onednn", "cpu": "malloc"}
"""TensorFlow's names of its host allocators (TF 2.21), and what `host_allocator` calls them."""


def host_allocator():
    """Which allocator serves TensorFlow's host (CPU) tensors in this process.

    TensorFlow picks it once, when it creates its CPU device:
    ``TF_CPU_ALLOCATOR_USE_BFC=true`` gives its pooled BFC allocator
    ('pooled', what `use_pooled_host_allocator` asks for); otherwise an x86
    Linux build runs with oneDNN, which TensorFlow turns on by default on CPUs
    with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX (``TF_ENABLE_ONEDNN_OPTS``
    overrides it), and then registers oneDNN's allocator ('onednn': a BFC pool
    for all but tiny buffers, plus malloc for those); on other CPUs, and with
    ``TF_ENABLE_ONEDNN_OPTS=0``, host tensors come from plain aligned malloc
    ('malloc'). Both pools keep statistics
    (`tf.config.experimental.get_memory_info`), so statistics cannot tell the
    pool from oneDNN's allocator; the allocator's name can. TensorFlow records
    it in a traced step's memory statistics, read here from a one-op graph on
    CPU:0 (`_compat.traced_allocator_names`; the CPU allocator is one per
    process, shared by graphs and eager code).

    This initializes TensorFlow's devices: call it after splitting CPUs and
    setting GPU memory options.

    Example:

        memory.use_pooled_host_allocator()
        print(memory.host_allocator())  # 'pooled'; without the first line 'onednn' or 'malloc'

    Returns:
      'pooled', 'onednn' or 'malloc' (see `HOST_ALLOCATOR_KINDS`), TensorFlow's
      own name for an allocator not listed there, or None if it recorded none.
    """
    tf.config.list_logical_devices("CPU")  # the devices, and their allocator, as eager code has
    names = _compat.traced_allocator_names("CPU:0")
    if not names:
        return None
    return HOST_ALLOCATOR_KINDS.get(names[0], names[0])


def pooled_host_allocator_active():
    """True when host tensors come from the pooled BFC allocator `use_pooled_host_allocator` sets.

    Reads the allocator's name (`host_allocator`): the presence of allocator
    statistics is no evidence, since oneDNN's default allocator keeps them too.
    This initializes TensorFlow's devices: call it after splitting CPUs and
    setting GPU memory options.
    """
    return host_allocator() == "pooled"


def free_memory():
    """Drops Keras's global state and collects garbage, e.g. between trials.

    Models still referenced keep working; only unreferenced ones are freed.
    """
    keras.backend.clear_session()
    gc.collect()


def _proc_status_mb(field):
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) / 1024 if match else None


def rss_mb():
    """Resident memory of this process now, in MB."""

    return psutil.Process().memory_info().rss / _MB


def reset_peak_rss():
    """Restarts the peak-RSS count (Linux: /proc/self/clear_refs); False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb():
    """Peak resident memory of this process since start or `reset_peak_rss`, in MB.

    Falls back to the current RSS where the kernel does not report a peak.
    """
    peak = _proc_status_mb("VmHWM")
    return peak if peak is not None else rss_mb()


def gpu_devices():
    """Names of the logical GPUs ('GPU:0', ...), empty on CPU-only machines."""
    return [d.name.split("device:")[-1] for d in tf.config.list_logical_devices("GPU")]


def reset_peak_memory(devices=None):
    """Restarts the peak count of every GPU (or of the process RSS without GPUs).

    `devices`: the GPUs (`gpu_devices()`, the default), when the caller has them already.
    """
    devices = gpu_devices() if devices is None else devices
    for device in devices:
        tf.config.experimental.reset_memory_stats(device)
    if not devices:
        reset_peak_rss()


def peak_memory_mb(devices=None):
    """{name: peak MB since `reset_peak_memory`}: 'gpu0_peak_mb', ... or 'peak_rss_mb'.

    `devices`: the GPUs (`gpu_devices()`, the default), when the caller has them already.
    """
    devices = gpu_devices() if devices is None else devices
    if devices:
        return {f"gpu{i}_peak_mb": tf.config.experimental.get_memory_info(d)["peak"] / _MB
                for i, d in enumerate(devices)}
    return {"peak_rss_mb": peak_rss_mb()}


class PeakMemoryLogger(EpochScalarLogger):
    """Logs each epoch's peak memory to TensorBoard as `memory/<name>` and to `logs`.

    Without GPUs the value is the process's peak RSS during the epoch (the
    dataset, model, and TensorFlow runtime included); with GPUs, TensorFlow's
    per-GPU allocator peak.

    Example:

        model.fit(ds, epochs=3, callbacks=[PeakMemoryLogger("runs/a/logs/train")])

    Args:
      logdir: TensorBoard log directory.
    """

    tag_prefix = "memory/"

    def on_train_begin(self, logs=None):
        self._devices = gpu_devices()  # looked up once, not twice per epoch

    def on_epoch_begin(self, epoch, logs=None):
        reset_peak_memory(self._devices)

    def epoch_values(self, epoch):
        return peak_memory_mb(self._devices)


def training_peak_bytes(step, steps=3, warmup=2, device=None):
    """Peak bytes TensorFlow's allocator held while `step()` (one training step) ran `steps`
    times, after `warmup` runs (traced, variables and slots made).

    Reads the allocator's own statistics (`tf.config.experimental.get_memory_info`): on a
    CPU they exist under the pooled host allocator (`use_pooled_host_allocator`, set before
    the first op) or oneDNN's. The order in which TensorFlow runs independent ops differs
    between runs, and so do the chunks the allocator hands out (`step_profile.
    allocator_peak` shows both), and so does the peak: take the largest of a few processes
    for a bound. A model loaded from a file may keep its weights outside the allocator
    (its peak then lacks them): call `weights_into_pool(model)` after loading.

    Args:
      step: a callable running one training step (e.g. ``lambda: model.fit(ds, steps_per_epoch
        =1, verbose=0)``, or a `tf.function`).
      device: 'GPU:0' or 'CPU:0'; default: the first GPU, else the CPU.
    """
    device = device or ("GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0")
    for _ in range(warmup):
        step()
    tf.config.experimental.reset_memory_stats(device)
    for _ in range(steps):
        step()
    return int(tf.config.experimental.get_memory_info(device)["peak"])


def weights_into_pool(model):
    """Copies each of `model`'s weights into a buffer of TensorFlow's allocator.

    Why: a model loaded from a file may keep the arrays it read as its weights' buffers
    (`variable.assign` of a NumPy array can adopt the array's memory), outside the allocator
    whose statistics `training_peak_bytes` reads: a tf_keras keras.applications ResNet50
    loaded from .keras held 0.08 of its 94 MB of weights in the pooled host allocator, and
    its measured training peak at batch 16 was 368 MiB against 457 MiB after the copy. Which
    weights a load leaves outside differs from load to load. A model built in-process is
    unchanged (its weights are already the allocator's). The run's real memory is the same
    either way; only the allocator's count misses them.

    Example:

        model = keras.models.load_model("model.keras")
        memory.weights_into_pool(model)
        peak = memory.training_peak_bytes(lambda: model.fit(ds, steps_per_epoch=1, verbose=0))
    """
    for v in model.weights:
        v.assign(tf.raw_ops.DeepCopy(x=tf.convert_to_tensor(v)))
