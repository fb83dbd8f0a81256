"""What TensorFlow's pooled (BFC) allocator holds for a sequence of allocations and frees.

TensorFlow's best-fit-with-coalescing allocator (`tensorflow/core/common_runtime/
bfc_allocator.cc`, used for GPU memory and, under `memory.use_pooled_host_allocator`,
for host memory) counts as "in use" the size of the chunk it hands out, not the size
asked for: a request is rounded up to 256 bytes and served from the smallest free chunk
that holds it (bins of sizes 256 x 2^k, best fit in a bin); that chunk is split only
when it is at least twice the request, so a 4 MB tensor may take a free 7.9 MB chunk
whole. When nothing fits, the pool grows by a new region (2 MiB at first, each next one
twice the last, or the request's size rounded up by doublings); chunks of different
regions never merge. Between free chunks of one size the lower address wins; a fresh
host process's regions come from the system allocator at ever lower addresses (its
regions of 2-16 MiB, measured), so a tie goes to the newest region (`PoolSimulator`'s
`descending`). The peak the allocator reports
(`tf.config.experimental.get_memory_info(...)["peak"]`) therefore exceeds the peak of
the tensors alive at once by the chunks' slack, and which chunks are free when a large
tensor arrives depends on what ran before: measured under TensorFlow's profiler, the
zoo CNN's step at batch 512 held a [512, 8, 8, 32] float32 tensor (4.19 MB) in a
5.10 MB chunk and a [512, 1024] one (2.10 MB) in 3.14 MB.

`PoolSimulator` replays allocations and frees through the same rules and reports the
peak in-use bytes; `memory_graph` feeds it a training step's buffers in the order the
graph makes them. It is a model of the allocator's rules, not of TensorFlow's op
scheduling: the real order varies from run to run (independent ops run in parallel),
and so does the real peak. Given the real sequence, it is exact: `replay_allocations`
replays a profiler trace of a whole process (`step_profile.allocation_events`), and every
chunk it hands out is the size the real allocator handed out (tests/test_memory_pool.py
checks this on processes training the zoo CNN, with falling and with rising regions).

Example:

    from tfaccel.performance.memory_pool import PoolSimulator

    pool = PoolSimulator()
    a = pool.allocate(3 << 20)
    pool.free(a)
    pool.allocate(2 << 20)       # served whole from the freed 3 MiB chunk (< 2x)
    print(pool.in_use, pool.peak)   # 3145728 3145728
"""

import bisect
import dataclasses

from tfaccel.errors import ConfigError

MIN_ALLOCATION = 256
"""Requests are rounded up to a multiple of this (kMinAllocationSize)."""
BINS = 21
"""Free chunks are binned by size: bin k holds sizes in [256 x 2^k, 256 x 2^(k+1))."""
FIRST_REGION = 2 << 20
"""The first region of a growing pool (allow_growth: min(memory, 2 MiB))."""
MAX_SLACK = 128 << 20
"""A chunk is split when the request leaves at least this much of it (or half of it)."""


def rounded(nbytes):
    """`nbytes` rounded up to the allocator's granularity (at least one unit)."""
    return max(MIN_ALLOCATION, -(-int(nbytes) // MIN_ALLOCATION) * MIN_ALLOCATION)


def _bin(size):
    return min(BINS - 1, max(0, (size // MIN_ALLOCATION).bit_length() - 1))


@dataclasses.dataclass
class _Chunk:
    start: int
    size: int
    region: int
    free: bool = True


class PoolSimulator:
    """The BFC allocator's bookkeeping for a sequence of `allocate`/`free` calls: the bytes in
    use (chunk sizes, as the allocator counts them), their peak and the regions grown.

    `descending`: each new region lies below the last (a tie between free chunks of one
    size goes to the newest region), as the host's do when glibc's malloc maps them (at or
    above its mmap threshold: 128 KiB in a fresh process); False for regions at rising
    addresses, as a process that freed a large array first gets them (glibc then raises
    the threshold and serves the regions from its heap; measured after a freed 16 MB
    array). A GPU's regions come from its driver; their direction is not measured here,
    and the plan replays them as a fresh host process's."""

    def __init__(self, first_region=FIRST_REGION, descending=True):
        self.next_region = int(first_region)
        self.descending = bool(descending)
        self.regions = []
        self.region_starts = []  # each region's address, in the order they grew
        self.in_use = 0
        self.peak = 0
        self._chunks = {}  # start -> _Chunk (every chunk, by address)
        self._starts = []  # sorted chunk starts
        self._bins = [[] for _ in range(BINS)]  # sorted (size, start) of free chunks
        self._top = 1 << 60 if self.descending else 0  # where the next region starts or ends

    def reset_peak(self):
        """Starts a new peak from what is in use now (`reset_memory_stats`)."""
        self.peak = self.in_use

    def _add_free(self, chunk):
        chunk.free = True
        bisect.insort(self._bins[_bin(chunk.size)], (chunk.size, chunk.start))

    def _remove_free(self, chunk):
        b = self._bins[_bin(chunk.size)]
        del b[bisect.bisect_left(b, (chunk.size, chunk.start))]
        chunk.free = False

    def _insert(self, chunk):
        self._chunks[chunk.start] = chunk
        bisect.insort(self._starts, chunk.start)

    def _extend(self, size, at=None):
        grew = False
        while size > self.next_region:
            self.next_region *= 2
            grew = True
        region = self.next_region
        if not grew:
            self.next_region *= 2
        if at is not None and any(start < at + region and at < start + span for start, span
                                  in zip(self.region_starts, self.regions)):
            at = None  # overlaps a region already grown (a replay that diverged): laid out anew
        if at is None and self.descending:
            self._top -= region + MIN_ALLOCATION  # a gap: regions never merge
        chunk = _Chunk(self._top if at is None else int(at), region, len(self.regions))
        self.regions.append(region)
        self.region_starts.append(chunk.start)
        if at is None and not self.descending:
            self._top += region + MIN_ALLOCATION
        self._insert(chunk)
        self._add_free(chunk)

    def _find(self, size):
        for k in range(_bin(size), BINS):
            b = self._bins[k]
            i = bisect.bisect_left(b, (size, -1))
            if i < len(b):
                return self._chunks[b[i][1]]
        return None

    def allocate(self, nbytes, region_at=None):
        """Serves `nbytes`; returns the chunk's address (to `free`). `region_at`: where a new
        region lies if this request needs one (a replayed trace's real address: its first
        chunk starts the region)."""
        size = rounded(nbytes)
        chunk = self._find(size)
        if chunk is None:
            self._extend(size, region_at)
            chunk = self._find(size)
        self._remove_free(chunk)
        if chunk.size >= 2 * size or chunk.size - size >= MAX_SLACK:
            rest = _Chunk(chunk.start + size, chunk.size - size, chunk.region)
            chunk.size = size
            self._insert(rest)
            self._add_free(rest)
        self.in_use += chunk.size
        self.peak = max(self.peak, self.in_use)
        return chunk.start

    def size_at(self, address):
        """The bytes of the chunk at `address` (an allocation's, as `in_use` counts it)."""
        return self._chunks[address].size

    def _neighbour(self, chunk, step):
        i = bisect.bisect_left(self._starts, chunk.start) + step
        if 0 <= i < len(self._starts):
            other = self._chunks[self._starts[i]]
            if other.region == chunk.region and other.free:
                return other
        return None

    def free(self, address):
        """Returns the chunk at `address` to the pool, merged with free neighbours."""
        chunk = self._chunks[address]
        self.in_use -= chunk.size
        after = self._neighbour(chunk, 1)
        if after is not None:
            self._remove_free(after)
            chunk.size += after.size
            del self._chunks[after.start]
            del self._starts[bisect.bisect_left(self._starts, after.start)]
        before = self._neighbour(chunk, -1)
        if before is not None:
            self._remove_free(before)
            before.size += chunk.size
            del self._chunks[chunk.start]
            del self._starts[bisect.bisect_left(self._starts, chunk.start)]
            chunk = before
        self._add_free(chunk)


def slack_share(peak, slack):
    """The pool's slack at a peak as a share of the bytes asked for (the peak less the slack):
    how much more the chunks held than the tensors needed. Buffers whose chunks are not
    known (held from before a trace) count as asked for."""
    return slack / max(1, peak - slack)


def replay_allocations(events, first_region=FIRST_REGION):
    """(pool, held): the allocations and frees of a real allocator's trace replayed through
    `PoolSimulator`, and the chunk bytes it handed out for each allocation, in order.

    `events` are dicts as `step_profile.allocation_events` reads them from a profiler
    trace: ``allocated``, ``address`` (the real one, to pair a free with its allocation),
    ``requested``. Each region the replay grows is placed at the real address of the
    allocation that needed it (its first chunk starts the region), so ties between free
    chunks break as they did in the run, whichever way its regions were laid out. Why: it
    checks the simulator against the allocator it models (each ``held`` should equal the
    trace's own), and answers what-ifs on a real run's sequence. The trace must start
    with the pool empty: start the profiler before the process's first TensorFlow op.

    Example:

        events = step_profile.allocation_events(step_profile.last_trace(logdir))
        pool, held = memory_pool.replay_allocations(events)
        print(pool.peak, sum(h != e["held"] for h, e in zip(
            held, [e for e in events if e["allocated"]])))   # <peak> 0
    """
    events = list(events)
    first = events[0] if events else {}
    if first.get("in_use", first.get("held")) != first.get("held"):
        raise ConfigError(f"the trace starts with {events[0]['in_use']:,} bytes in use: replay "
                          "a trace started before the allocator's first allocation (start the "
                          "profiler before the first TensorFlow op)")
    pool, addresses, held = PoolSimulator(first_region), {}, []
    for event in events:
        if event["allocated"]:
            start = pool.allocate(event["requested"], region_at=event["address"])
            addresses[event["address"]] = start
            held.append(pool.size_at(start))
        elif event["address"] in addresses:
            pool.free(addresses.pop(event["address"]))
    return pool, held


def training_peaks(persistent, step, created_after_first_step=(), warmup=2, steps=3):
    """(pool peak, exact peak) of a training loop as `memory.training_peak_bytes` reads it:
    `persistent` buffer sizes allocated first (weights, the input batch), `warmup` runs of
    `step` (a `memory_graph.step_buffers` list), the `created_after_first_step` sizes made
    by the first run's end (optimizer slots, made at the first update), the peak reset,
    then `steps` more runs. The exact peak is the same sequence counted by the bytes
    asked for: the difference is the pool's slack."""
    pool = PoolSimulator()
    exact = exact_peak = 0
    for size in persistent:
        pool.allocate(size)
        exact += rounded(size)
    for run in range(warmup + steps):
        if run == warmup:
            pool.reset_peak()
            exact_peak = exact
        held, sizes = {}, {}
        for name, nbytes, _ in step:
            if nbytes is None:
                if name in held:
                    pool.free(held.pop(name))
                    exact -= sizes.pop(name)
            else:
                held[name] = pool.allocate(nbytes)
                sizes[name] = rounded(nbytes)
                exact += sizes[name]
                exact_peak = max(exact_peak, exact)
        if run == 0:
            for size in created_after_first_step:
                pool.allocate(size)
                exact += rounded(size)
        for name in list(held):
            pool.free(held.pop(name))
            exact -= sizes.pop(name)
    return pool.peak, exact_peak
