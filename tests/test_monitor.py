"""Hardware monitor (NVML or CPU), step timing, trial reports."""

import types
import warnings

import numpy as np
import pytest
import tensorflow as tf

from tfaccel import monitor, summaries
from tfaccel.errors import ConfigError
from tfaccel.keras import keras, keras3
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


class FakeClock:
    """A clock that moves only when a fake step runs: step i takes `durations[i]` seconds."""

    def __init__(self, durations):
        self.now, self.durations, self.calls = 100.0, list(durations), 0

    def __call__(self):
        return self.now

    def step(self):
        self.now += self.durations[self.calls]
        self.calls += 1


def test_step_times_statistics():
    times = monitor.StepTimes(seconds=(0.4, 0.1, 0.3, 0.2), warmup_seconds=(5.0,))
    assert times.median == pytest.approx(0.25)
    assert times.mean == pytest.approx(0.25)
    assert times.percentile(50) == pytest.approx(0.25)
    assert times.percentile(90) == pytest.approx(0.37)  # NumPy's linear interpolation
    assert times.percentile(100) == 0.4
    assert times.total == pytest.approx(6.0)  # the warm-up counts in the wall time only
    assert times.rate(64) == pytest.approx(256.0)  # examples (or tokens) per second
    assert times.summary(64) == pytest.approx(
        {"seconds_per_step": 0.25, "steps_per_sec": 4.0, "examples_per_sec": 256.0})
    assert monitor.StepTimes.split([9, 8, 1, 2], warmup=2) == monitor.StepTimes((1, 2), (9, 8))


def test_time_steps_leaves_the_warmup_out():
    clock = FakeClock([3.0, 2.0, 0.5, 0.25, 0.75])
    times = monitor.time_steps(clock.step, steps=3, warmup=2, clock=clock)
    assert clock.calls == 5
    assert times.warmup_seconds == (3.0, 2.0)
    assert times.seconds == (0.5, 0.25, 0.75)
    assert times.median == 0.5


def test_time_steps_stops_after_the_step_that_passes_the_deadline():
    clock = FakeClock([1.0] * 10)
    times = monitor.time_steps(clock.step, steps=10, warmup=1, deadline=103.5, clock=clock)
    # Steps end at 101, 102, 103, 104: the one running when 103.5 passed is the last.
    assert clock.calls == 4 and times.warmup_seconds == (1.0,) and times.seconds == (1.0,) * 3
    clock = FakeClock([1.0] * 10)
    times = monitor.time_steps(clock.step, steps=10, warmup=3, deadline=101.5, clock=clock)
    assert clock.calls == 2 and times.seconds == ()  # the deadline passed in the warm-up


def test_time_steps_with_no_timed_step_only_warms_up():
    clock = FakeClock([1.0] * 5)
    assert monitor.time_steps(clock.step, steps=0, warmup=3, clock=clock).warmup_seconds == \
        (1.0,) * 3
    assert clock.calls == 3
    assert monitor.time_steps(clock.step, steps=0, clock=clock) == monitor.StepTimes()
    assert clock.calls == 3


def test_step_clock_laps_and_spans():
    now = [0.0]
    clock = monitor.StepClock(steps=2, warmup=1, clock=lambda: now[0])
    clock.start()
    now[0] = 4.0
    assert not clock.lap() and clock.running  # the warm-up ended, the next step began
    now[0] = 5.0
    assert not clock.stop() and not clock.running
    now[0] = 10.0  # between steps: not timed
    clock.start()
    now[0] = 12.0
    assert clock.lap() and clock.done  # both timed steps ran
    clock.cancel()
    assert not clock.running
    assert clock.times() == monitor.StepTimes((1.0, 2.0), (4.0,))
    assert clock.step_seconds == [4.0, 1.0, 2.0]
    with pytest.raises(ConfigError, match="warmup=-1"):
        monitor.StepClock(warmup=-1)


def test_step_timer_times_fit_steps_and_ends_fit_when_done():
    model = _model()
    timer = monitor.StepTimer(steps=3, warmup=2)
    model.fit(_dataset().repeat(), steps_per_epoch=50, epochs=1, verbose=0, callbacks=[timer])
    assert int(model.optimizer.iterations.numpy()) == 5  # fit ended after the 5th step
    times = timer.times()
    assert len(times.warmup_seconds) == 2 and len(times.seconds) == 3
    assert timer.step_seconds == [*times.warmup_seconds, *times.seconds]
    assert all(0 < s < 5 for s in timer.step_seconds)


def test_time_fit_stops_after_the_step_that_passes_the_deadline():
    model, ticks = _model(), iter(range(1000))
    # A clock that ticks once a reading: the StepTimer reads it once at the first batch
    # begin (0), then once per batch end (1, 2, ...); the deadline 3 passes at the 3rd step.
    times = monitor.time_fit(model, _dataset(), steps=20, warmup=1, deadline=3,
                             clock=lambda: next(ticks))
    assert int(model.optimizer.iterations.numpy()) == 3
    assert times == monitor.StepTimes((1, 1), (1,))
    with pytest.raises(ConfigError, match="steps=0"):
        monitor.time_fit(model, _dataset(), steps=0)


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


def test_time_fit_of_a_keras3_model_raises_no_shuffle_warning():
    k3 = keras3()
    model = k3.Sequential([k3.Input((4,)), k3.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"),
                                               np.ones((8, 2), "float32"))).batch(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        times = monitor.time_fit(model, data, steps=2, warmup=1)
    assert len(times.seconds) == 2 and int(model.optimizer.iterations.numpy()) == 3
    assert not [w for w in caught if "shuffle" in str(w.message)]
