"""tfaccel.performance.step_profile: a profiler trace of chosen steps, and its op times."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import check_flag_error

from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.performance import step_profile


def test_traces_the_chosen_steps_under_the_logdir_and_sums_their_ops(tmp_path):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(8 * 16, 64)).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, np.arange(len(x)) % 10)).batch(16)
    lines = []
    profile = step_profile.ProfileSteps(tmp_path / "train", 3, 5, printer=lines.append)
    model.fit(ds, epochs=1, verbose=0, callbacks=[profile])
    path = step_profile.last_trace(tmp_path / "train")
    assert path and path.startswith(os.path.join(str(tmp_path / "train"), "plugins", "profile"))
    table = {row["op"]: row for row in profile.table}
    products = [row for op, row in table.items() if "MatMul" in op]  # oneDNN fuses some
    # 2 layers: 2 products forward, 3 backward (no input gradient for the first), per step.
    assert sum(row["ops_per_step"] for row in products) == pytest.approx(5, abs=0.5), table
    assert all(row["ms_per_step"] > 0 for row in products)
    assert sum(row["share"] for row in profile.table) == pytest.approx(1.0)
    assert "Process" not in table  # the executor's wrapper events are not ops
    assert lines and lines[0].startswith("profile of steps 3-5 (")


def test_a_fit_shorter_than_the_range_ends_the_trace_with_it(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    profile = step_profile.ProfileSteps(tmp_path, 2, 50, printer=None)
    model.fit(np.ones((32, 4)), np.ones((32, 2)), batch_size=8, epochs=1, verbose=0,
              callbacks=[profile])
    assert step_profile.last_trace(tmp_path) and profile.table
    assert step_profile.last_trace(tmp_path / "nothing") is None


@pytest.mark.parametrize("start,stop", [(0, 3), (5, 2), (1.5, 3)])
def test_bad_step_ranges_are_refused(start, stop):
    with pytest.raises(ConfigError, match="1 <= start <= stop, e.g. 20,24"):
        step_profile.check_profile_steps(start, stop)


def test_train_lm_refuses_a_bad_range_in_one_line(tmp_path):
    check_flag_error("train_lm", f"--model_dir={tmp_path / 'run'}", "--profile_steps=9,2",
                     line="--profile_steps=9,2 must be start,stop: two step numbers, start <= "
                     "stop, e.g. --profile_steps=20,24")


def _trace_file(path, events, allocator="bfc_cpu_allocator_for_gpu"):
    """An .xplane.pb holding `events`: (kind, time_ns, address, bytes in use after, requested,
    held, op, shape) of `allocator`, as TensorFlow's BFC allocator records them."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    stat_ids = {}
    for name in ("allocator_name", "addr", "bytes_allocated", "requested_bytes",
                 "allocation_bytes", "tf_op", "shape", allocator):
        stat_ids[name] = len(stat_ids) + 1
        plane.stat_metadata[stat_ids[name]].name = name
    plane.event_metadata[1].name = "MemoryAllocation"
    plane.event_metadata[2].name = "MemoryDeallocation"
    line = plane.lines.add(name="allocations", timestamp_ns=1000)
    for kind, t, address, in_use, requested, held, op, shape in events:
        event = line.events.add(metadata_id=1 if kind == "alloc" else 2, offset_ps=t * 1000)
        event.stats.add(metadata_id=stat_ids["allocator_name"], ref_value=stat_ids[allocator])
        for name, value in (("addr", address), ("bytes_allocated", in_use),
                            ("requested_bytes", requested), ("allocation_bytes", held)):
            event.stats.add(metadata_id=stat_ids[name], uint64_value=value)
        if op:
            event.stats.add(metadata_id=stat_ids["tf_op"], str_value=op)
            event.stats.add(metadata_id=stat_ids["shape"], str_value=shape)
    path.write_bytes(space.SerializeToString())
    return str(path)


def test_the_allocator_peak_is_the_buffers_alive_when_the_bytes_in_use_peaked(tmp_path):
    # 1,000 bytes held from before the trace; a freed buffer of an address allocated before
    # the trace is ignored; events arrive out of time order (the lines of several threads)
    path = _trace_file(tmp_path / "a.xplane.pb", [
        ("alloc", 1, 16, 1_512, 400, 512, "MatMul", "[10,10]"),
        ("alloc", 3, 32, 3_560, 1_500, 2_048, "Relu", "[375]"),
        ("alloc", 2, 48, 1_768, 256, 256, "Sum", "[]"),
        ("free", 4, 16, 3_048, 0, 0, "", ""),
        ("free", 5, 999, 2_800, 0, 0, "", ""),
        ("alloc", 6, 64, 3_056, 256, 256, "Mul", "[64]")])
    peak = step_profile.allocator_peak(path)
    assert peak.peak == 3_560
    assert peak.buffers == (step_profile.LiveBuffer("Relu", "[375]", 1_500, 2_048),
                            step_profile.LiveBuffer("MatMul", "[10,10]", 400, 512),
                            step_profile.LiveBuffer("Sum", "[]", 256, 256))
    assert peak.before == 3_560 - 2_816
    assert (peak.requested, peak.slack) == (2_156, 660)
    text = step_profile.format_allocator_peak(peak, top=2)
    assert text.splitlines()[0].startswith("allocator peak 0.00 MB: 0.00 MB held from before")
    assert peak.slack_share == pytest.approx(660 / (3_560 - 660))
    assert "(23% of all asked for: a chunk under twice a request is served whole)" in text
    assert len(text.splitlines()) == 3 and "Relu [375]" in text.splitlines()[1]
    # another device's allocator, or none at all
    assert step_profile.allocator_peak(path, "GPU:0") is None
    gpu = _trace_file(tmp_path / "g.xplane.pb", [("alloc", 1, 16, 512, 300, 512, "Conv2D", "[1]")],
                      allocator="GPU_1_bfc")
    assert step_profile.allocator_peak(gpu, "/device:GPU:1").peak == 512
    assert step_profile.allocator_peak(gpu, "CPU:0") is None
    with pytest.raises(ConfigError, match="give 'CPU:0' or 'GPU:<n>'"):
        step_profile.allocator_peak(gpu, "TPU:0")


_POOLED_PEAK = """
from tfaccel.performance import memory
memory.use_pooled_host_allocator()
import numpy as np, tensorflow as tf
from tfaccel.keras import keras
from tfaccel.performance import step_profile
x = tf.ones((512, 1000))
@tf.function
def step(x):
    return tf.reduce_sum(tf.nn.relu(tf.matmul(x, x, transpose_b=True)))
step(x)
tf.config.experimental.reset_memory_stats("CPU:0")
peak = step_profile.traced_allocator_peak(lambda: step(x))
assert peak.peak == tf.config.experimental.get_memory_info("CPU:0")["peak"], peak
products = [b for b in peak.buffers if b.shape == "[512,512]"]
assert products and products[0].requested == 512 * 512 * 4, peak
assert peak.before >= 512 * 1000 * 4, peak  # x, allocated before the trace
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128), keras.layers.Dense(10)])
model.compile("sgd", "mse")
lines = []
model.fit(np.ones((64, 64)), np.ones((64, 10)), batch_size=16, verbose=0,
          callbacks=[step_profile.ProfileSteps("{logdir}", 2, 3, printer=lines.append)])
assert lines[-1].startswith("allocator peak "), lines
print("OK", peak.peak, peak.requested, peak.slack)
"""


def test_a_run_under_the_pooled_allocator_is_traced_to_its_peak_buffers(tmp_path):
    # a fresh process: the pooled host allocator must be set before TensorFlow's first op
    proc = subprocess.run([sys.executable, "-c", _POOLED_PEAK.replace("{logdir}", str(tmp_path))],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and "OK " in proc.stdout, proc.stderr[-3000:]


def test_without_a_recording_allocator_the_trace_names_the_fix(monkeypatch):
    monkeypatch.setattr(step_profile, "allocator_peak", lambda path, device: None)
    with pytest.raises(ConfigError, match="use_pooled_host_allocator\\(\\) before"):
        step_profile.traced_allocator_peak(lambda: tf.ones(2) + 1, "CPU:0")
