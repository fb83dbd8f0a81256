"""GPU memory settings (warnings without GPUs), peak memory per epoch, freeing memory."""

import numpy as np
import pytest

from tfaccel import memory, summaries
from tfaccel.errors import ConfigError
from tfaccel.keras import keras


def test_gpu_settings_on_a_machine_without_gpus_only_warn(monkeypatch):
    monkeypatch.delenv("TF_GPU_ALLOCATOR", raising=False)
    warnings = memory.configure_gpu_memory(limit_mb=1024, gpus=[])
    assert warnings == ["no GPU visible: a 1024 MB memory limit ignored (GPU memory settings "
                        "only apply to GPUs)"]
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
