"""tfaccel.performance.memory_pool: the pooled (BFC) allocator's rules, replayed."""

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
