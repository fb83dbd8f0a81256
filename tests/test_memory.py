"""GPU memory settings (warnings without GPUs), the pooled host allocator, peak memory per
epoch, freeing memory."""

import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from tfaccel import summaries
from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.performance import memory


def test_gpu_settings_on_a_machine_without_gpus_only_warn(monkeypatch):
    monkeypatch.delenv("TF_GPU_ALLOCATOR", raising=False)
    warnings = memory.configure_gpu_memory(limit_mb=1024, gpus=[])
    assert warnings == [("no GPU visible: a 1024 MB memory limit ignored (GPU memory settings "
                         "only apply to GPUs)")]
    warnings = memory.configure_gpu_memory(growth=True, allocator="cuda_malloc_async", gpus=[])
    assert "memory growth and the cuda_malloc_async allocator ignored" in warnings[0]
    assert memory.configure_gpu_memory(gpus=[]) == []


def test_allocator_is_set_through_the_environment(monkeypatch):
    monkeypatch.delenv("TF_GPU_ALLOCATOR", raising=False)
    memory.configure_gpu_memory(allocator="cuda_malloc_async", gpus=[])
    import os

    assert os.environ["TF_GPU_ALLOCATOR"] == "cuda_malloc_async"


@pytest.mark.parametrize("kwargs,message", [
    ({"allocator": "pool"}, "unknown GPU allocator 'pool'"),
    ({"limit_mb": 0}, "memory limit 0 MB must be positive"),
    ({"growth": True, "limit_mb": 512}, "cannot be combined"),
])
def test_bad_settings_are_rejected(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        memory.configure_gpu_memory(gpus=[], **kwargs)


def test_peak_rss_sees_a_short_lived_allocation():
    assert memory.reset_peak_rss()
    before = memory.peak_rss_mb()
    block = np.ones(200 * 1024 * 1024 // 8)  # 200 MB, touched
    del block
    after = memory.peak_rss_mb()
    assert after - before > 150
    assert memory.rss_mb() < after  # freed again, but the peak remembers it
    memory.reset_peak_rss()
    assert memory.peak_rss_mb() < after - 150


def test_peak_memory_logger_writes_each_epoch(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    logger = memory.PeakMemoryLogger(tmp_path)
    history = model.fit(np.zeros((8, 4)), np.zeros((8, 2)), epochs=2, verbose=0,
                        callbacks=[logger])
    scalars = summaries.read_scalars(tmp_path)["memory/peak_rss_mb"]
    assert [step for step, _ in scalars] == [0, 1]
    rss = memory.rss_mb()
    for _, value in scalars:
        assert 0.5 * rss < value < 4 * rss  # the process's real size, not a placeholder
    assert history.history["peak_rss_mb"] == pytest.approx([v for _, v in scalars], rel=1e-6)


def test_free_memory_resets_keras_global_state():
    keras.layers.Dense(1, name=None)
    keras.layers.Dense(1)
    memory.free_memory()
    assert keras.layers.Dense(1).name == "dense"


_POOL_CHECK = """
import tensorflow as tf
from tfaccel.performance import memory
if {pooled}:
    memory.use_pooled_host_allocator(limit_mb=512)
x = tf.ones((256, 1024)) * 2.0  # the first allocation creates TensorFlow's CPU allocator
print("kind", memory.host_allocator())
print("active", memory.pooled_host_allocator_active(), float(tf.reduce_sum(x)))
try:
    print("peak_bytes", tf.config.experimental.get_memory_info("CPU:0")["peak"])
except ValueError:  # "Allocator stats not available": plain malloc keeps none
    print("peak_bytes none")
"""

# TensorFlow's default policy for oneDNN (and with it oneDNN's allocator) on x86 Linux.
_ONEDNN_CPU_FLAGS = {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}


def _cpu_flags():
    with open("/proc/cpuinfo") as f:
        return next((set(line.split(":", 1)[1].split()) for line in f
                     if line.startswith("flags")), set())


@pytest.mark.parametrize("pooled", [True, False])
@pytest.mark.parametrize("onednn", [None, "1", "0"])  # None: this machine's default
def test_pooled_host_allocator_in_a_fresh_process(pooled, onednn):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TF_CPU_") and k != "TF_ENABLE_ONEDNN_OPTS"}
    if onednn is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = onednn
    if onednn != "0" and not pooled and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("oneDNN's allocator and its default policy are checked on x86 CPUs")
    proc = subprocess.run([sys.executable, "-c", _POOL_CHECK.format(pooled=pooled)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    onednn_on = onednn == "1" or (onednn is None and bool(_ONEDNN_CPU_FLAGS & _cpu_flags()))
    expected = "pooled" if pooled else "onednn" if onednn_on else "malloc"
    assert lines["kind"] == expected
    assert lines["active"] == f"{pooled} {2.0 * 256 * 1024}"
    if expected == "malloc":
        assert lines["peak_bytes"] == "none"
    else:  # both pools keep statistics, so statistics alone cannot tell them apart
        assert int(lines["peak_bytes"]) >= 256 * 1024 * 4


def test_pooled_allocator_comes_too_late_in_a_running_process(monkeypatch):
    monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC", raising=False)
    import tensorflow as tf

    float(tf.reduce_sum(tf.ones((64, 64))))  # this process has allocated host tensors already
    before = memory.host_allocator()
    memory.use_pooled_host_allocator()
    assert os.environ["TF_CPU_ALLOCATOR_USE_BFC"] == "true"
    assert before in ("onednn", "malloc")
    assert memory.host_allocator() == before
    assert memory.pooled_host_allocator_active() is False
    with pytest.raises(ConfigError, match="must be positive"):
        memory.use_pooled_host_allocator(limit_mb=0)


_LOADED_WEIGHTS_IN_POOL = """
import sys
from tfaccel.performance import memory
memory.use_pooled_host_allocator()
import tensorflow as tf
from tfaccel.train import models
model = models.load_model_file(sys.argv[1])
current = lambda: tf.config.experimental.get_memory_info("CPU:0")["current"]
before = current()
memory.weights_into_pool(model)
print(before, current())
"""


@pytest.mark.slow
def test_weights_a_loaded_model_keeps_outside_the_allocator_are_copied_into_it(tmp_path):
    # tf_keras's loader leaves a keras.applications ResNet50's weights in buffers TensorFlow's
    # pooled allocator does not own (0.1 of its 94 MB were in the pool), so a measured peak
    # would miss them
    import tf_keras

    model = tf_keras.applications.ResNet50(input_shape=(32, 32, 3), weights=None, classes=10)
    path = str(tmp_path / "resnet50.keras")
    model.save(path)
    weights = sum(int(v.shape.num_elements()) * 4 for v in model.weights)
    out = subprocess.run([sys.executable, "-c", _LOADED_WEIGHTS_IN_POOL, path],
                         capture_output=True, text=True, check=True).stdout
    before, after = (int(n) for n in out.split())
    assert before < 0.5 * weights  # what the loader left outside the pool
    assert after >= weights  # every weight now in it (the old buffers freed)
