"""tfaccel.performance.memory_pool: the pooled (BFC) allocator's rules, replayed."""

import json
import subprocess
import sys

import pytest

from tfaccel.errors import ConfigError
from tfaccel.performance import memory_pool
from tfaccel.performance.memory_pool import PoolSimulator

MiB = 1 << 20


def test_requests_round_up_to_256_bytes():
    pool = PoolSimulator()
    pool.allocate(1)
    pool.allocate(257)
    assert pool.in_use == 256 + 512


def test_a_free_chunk_under_twice_the_request_is_served_whole():
    pool = PoolSimulator()
    big = pool.allocate(3 * MiB)
    pool.allocate(1 * MiB)  # keeps the region's tail apart from the freed chunk
    pool.free(big)
    pool.allocate(2 * MiB)  # the freed 3 MiB chunk, not split: 3 < 2 x 2
    assert pool.in_use == 3 * MiB + 1 * MiB


def test_a_free_chunk_of_twice_the_request_is_split():
    pool = PoolSimulator()
    big = pool.allocate(3 * MiB)
    pool.allocate(1 * MiB)
    pool.free(big)
    pool.allocate(MiB + MiB // 2)  # 3 >= 2 x 1.5: split, only the request is in use
    assert pool.in_use == MiB + MiB // 2 + 1 * MiB


def test_regions_grow_by_doubling_and_freed_neighbours_merge():
    pool = PoolSimulator()
    pool.allocate(MiB)  # the first region: 2 MiB
    pool.allocate(3 * MiB)  # not in the 1 MiB left: a 4 MiB region, taken whole (< 2 x 3)
    assert pool.regions == [2 * MiB, 4 * MiB] and pool.in_use == 5 * MiB
    a, b = pool.allocate(MiB // 2), pool.allocate(MiB // 2)  # the first region's 1 MiB, split
    pool.free(a)
    pool.free(b)  # merged back into one 1 MiB chunk
    pool.allocate(MiB)  # fits it: no third region
    assert len(pool.regions) == 2 and pool.peak == pool.in_use == 6 * MiB


def test_training_peaks_count_the_slack_beyond_the_bytes_asked_for():
    # asked for at most 3 + 1 MiB at once; the 3 MiB buffer gets a new 4 MiB region whole
    # (not split: 4 < 2 x 3), so the pool holds 4 + 1 at the peak, in every step
    step = [("a", 3 * MiB, True), ("b", MiB, True), ("a", None, None), ("c", 2 * MiB, True),
            ("c", None, None), ("b", None, None)]
    pool, exact = memory_pool.training_peaks([], step, warmup=1, steps=2)
    assert (exact, pool) == (4 * MiB, 5 * MiB)
    # a persistent buffer made first is in use at the reset, so in both peaks
    pool, exact = memory_pool.training_peaks([MiB], step, warmup=1, steps=2)
    assert exact == 5 * MiB and pool >= exact


def _tie_then_merge(descending):
    """Two free 1 MiB chunks, one per region, then a 600 KB request (served whole from one),
    then the first region's other 1 MiB freed and 1.5 MiB asked for: it fits only where the
    freed neighbours merged, i.e. if the 600 KB went to the second region."""
    pool = PoolSimulator(descending=descending)
    a, b = pool.allocate(MiB), pool.allocate(MiB)  # fill the first region (2 MiB)
    c = pool.allocate(MiB)  # a second region (4 MiB), split
    pool.allocate(3 * MiB)  # its rest, whole
    pool.free(a)
    pool.free(c)
    pool.allocate(600 << 10)  # a tie: two free 1 MiB chunks
    pool.free(b)
    pool.allocate(3 * MiB // 2)
    return pool


def test_a_tie_between_free_chunks_of_one_size_goes_to_the_newest_region():
    # the host's regions lie at ever lower addresses and the lower address wins a tie
    pool = _tie_then_merge(descending=True)
    assert pool.regions == [2 * MiB, 4 * MiB] and pool.in_use == 2 * MiB + 4 * MiB
    # rising regions: the first region's chunk is taken, nothing merges, an 8 MiB region grows
    rising = _tie_then_merge(descending=False)
    assert rising.regions == [2 * MiB, 4 * MiB, 8 * MiB] and rising.in_use == 11 * MiB // 2


def test_a_replay_refuses_a_trace_that_starts_with_bytes_in_use():
    events = [{"allocated": True, "address": 16, "requested": 100, "held": 256, "in_use": 4352}]
    with pytest.raises(ConfigError, match="starts with 4,352 bytes in use: replay a trace "
                       "started before"):
        memory_pool.replay_allocations(events)


_WHOLE_PROCESS = """
import json, sys
from tfaccel.performance import memory
memory.use_pooled_host_allocator()
import numpy as np, tensorflow as tf
if sys.argv[2] == "heap":  # a large array freed: glibc serves the pool's regions from its heap
    big = np.ones(2_000_000)
    del big
tf.profiler.experimental.start(sys.argv[1])
from tfaccel.performance import memory_pool, step_profile
from tfaccel.train import models, training
model = models.build_model("cnn", (8, 8, 1), 10)
training.compile_classifier(model, training.make_optimizer("sgd", 1e-3))
x = np.random.default_rng(0).random((128, 8, 8, 1), dtype=np.float32)
ds = tf.data.Dataset.from_tensors((x, np.arange(128) % 10)).repeat()
model.fit(ds, steps_per_epoch=3, epochs=1, verbose=0)
peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
tf.profiler.experimental.stop()
events = step_profile.allocation_events(step_profile.last_trace(sys.argv[1]))
pool, held = memory_pool.replay_allocations(events)
real = [e["held"] for e in events if e["allocated"]]
starts = pool.region_starts
print(json.dumps({"peak": peak, "replayed_peak": pool.peak, "allocations": len(real),
                  "differ": sum(h != r for h, r in zip(held, real)),
                  "in_use": pool.in_use, "real_in_use": events[-1]["in_use"],
                  "falling": all(b < a for a, b in zip(starts, starts[1:])),
                  "rising": starts[1] > starts[0]}))
"""


@pytest.mark.parametrize("memory,direction", [("fresh", "falling"), ("heap", "rising")])
def test_a_replayed_process_gets_the_chunks_the_real_allocator_handed_out(tmp_path, memory,
                                                                          direction):
    # a process under the pooled host allocator, traced from before its first op: building,
    # compiling and training the zoo CNN, hundreds of allocations. Its regions are mapped
    # at falling addresses, or, after a freed 16 MB array, come from the heap, rising (those
    # under glibc's raised mmap threshold: with oneDNN off the CNN's 37 MB peak grows a
    # 32 MiB region, mapped again)
    proc = subprocess.run([sys.executable, "-c", _WHOLE_PROCESS, str(tmp_path), memory],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["allocations"] > 300 and got[direction], got
    assert got["differ"] == 0, got
    assert got["replayed_peak"] == got["peak"] and got["in_use"] == got["real_in_use"], got
