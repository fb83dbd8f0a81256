"""Hardware monitor (NVML or CPU), step timing, trial reports."""

import types

import numpy as np
import pytest
import tensorflow as tf

from tfaccel import monitor, summaries
from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.performance import memory


def _model():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    return model


def _dataset(n=80, batch=8):
    x = np.random.default_rng(0).normal(size=(n, 16)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, np.zeros((n, 2), "float32"))).batch(batch)


def test_cpu_monitor_logs_every_n_steps(tmp_path):
    monitor_cb = monitor.HardwareMonitor(tmp_path, every_n_steps=3)
    _model().fit(_dataset(), epochs=1, verbose=0, callbacks=[monitor_cb])  # 10 steps
    assert monitor_cb.sampler is None  # its own sampler is closed at train end
    scalars = summaries.read_scalars(tmp_path)
    assert [s for s, _ in scalars["monitor/rss_mb"]] == [3, 6, 9]
    assert [s for s, _ in scalars["monitor/cpu_utilization"]] == [3, 6, 9]
    rss = memory.rss_mb()
    assert all(0.5 * rss < v < 2 * rss for _, v in scalars["monitor/rss_mb"])
    assert all(0 <= v <= 100 * 64 for _, v in scalars["monitor/cpu_utilization"])
    assert monitor_cb.history[-1]["step"] == 9


def _fake_nvml(used_mb=(1000, 2000), util=(30, 70)):
    class NVMLError(Exception):
        pass

    handles = list(range(len(used_mb)))
    return types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(handles),
        nvmlDeviceGetHandleByIndex=lambda i: handles[i],
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=util[h], memory=0),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=used_mb[h] * 1024 * 1024),
    )


def test_nvml_sampler_reads_every_gpu(tmp_path):
    sampler = monitor.NvmlSampler(nvml=_fake_nvml())
    assert sampler.sample() == {"gpu0_utilization": 30.0, "gpu0_memory_mb": 1000.0,
                                "gpu1_utilization": 70.0, "gpu1_memory_mb": 2000.0}
    monitor_cb = monitor.HardwareMonitor(tmp_path, every_n_steps=5, sampler=sampler)
    _model().fit(_dataset(), epochs=1, verbose=0, callbacks=[monitor_cb])
    scalars = summaries.read_scalars(tmp_path)
    assert scalars["monitor/gpu1_memory_mb"] == [(5, 2000.0), (10, 2000.0)]


def test_gpus_without_nvml_fall_back_to_cpu():
    # This machine has no NVIDIA driver, so NVML cannot start even if GPUs were listed.
    assert isinstance(monitor.default_sampler(gpus=["fake GPU"]), monitor.CpuSampler)
    assert isinstance(monitor.default_sampler(gpus=[]), monitor.CpuSampler)


def test_bad_period_is_rejected():
    with pytest.raises(ConfigError, match="every_n_steps=0"):
        monitor.HardwareMonitor("/tmp/unused", every_n_steps=0)


def test_time_training_measures_real_steps():
    model = _model()
    before = [w.copy() for w in model.get_weights()]
    timing = monitor.time_training(model, _dataset(), batch_size=8, warmup=2, steps=4)
    assert int(model.optimizer.iterations.numpy()) == 6
    assert not np.allclose(before[0], model.get_weights()[0])
    assert 0 < timing["seconds_per_step"] < 5
    assert timing["examples_per_sec"] == pytest.approx(8 / timing["seconds_per_step"])
    with pytest.raises(ConfigError):
        monitor.time_training(model, _dataset(), 8, warmup=0)


def test_trial_report_has_table_plot_and_file(tmp_path):
    rows = [{"batch_size": 16, "status": "ok", "examples_per_sec": 100.0},
            {"batch_size": 32, "status": "out of memory"}]
    table = monitor.write_trial_report(tmp_path, "performance/test", rows, ["batch_size"],
                                       "examples_per_sec", path=str(tmp_path / "p.png"))
    assert summaries.read_text_summaries(tmp_path)["performance/test"] == table
    assert "| 32 | out of memory |" in table
    assert summaries.read_image_tags(tmp_path) == ["performance/test_plot"]
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
