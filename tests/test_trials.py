"""Timed trials: precision/XLA auto selection and the batch-size search, with injected
measurements (the rules), then for real."""

import json
import sys

import pytest
import tensorflow as tf
from conftest import RECIPES, check_flag_error, run_recipe

from tfaccel import data, summaries
from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.performance import batch_search, trials
from tfaccel.train import models, precision


def _fake_measure(rates, peaks=None, oom_from=None, calls=None):
    def measure(size):
        if calls is not None:
            calls.append(size)
        if oom_from is not None and size >= oom_from:
            raise tf.errors.ResourceExhaustedError(None, None, f"OOM when allocating batch {size}")
        return {"examples_per_sec": rates[size], "seconds_per_step": size / rates[size],
                "peak_memory_mb": (peaks or {}).get(size, 100.0)}
    return measure


RATES = {16: 100.0, 32: 180.0, 64: 300.0, 128: 350.0, 256: 340.0, 512: 330.0, 1024: 320.0}


def test_out_of_memory_stops_the_search_below_it():
    result = trials.search_batch_size(_fake_measure(RATES, oom_from=128), list(RATES))
    assert result.batch_size == 64
    assert [(r["batch_size"], r["status"]) for r in result.table] == [
        (16, "ok"), (32, "ok"), (64, "ok"), (128, "out of memory")]


def test_memory_budget_stops_the_search():
    peaks = {16: 100, 32: 150, 64: 250, 128: 450}
    result = trials.search_batch_size(_fake_measure(RATES, peaks), list(RATES),
                                      memory_budget_mb=300)
    assert result.batch_size == 64
    assert result.table[-1] == {"batch_size": 128, "status": "over memory budget",
                                "examples_per_sec": 350.0,
                                "ms_per_step": pytest.approx(1000 * 128 / 350),
                                "peak_memory_mb": 450, "seconds": result.table[-1]["seconds"]}
    assert result.stopped == "size 128 went over the memory budget of 300 MB"
    assert result.budget_seconds == float("inf")  # no time budget unless asked


def test_sizes_the_memory_plan_rules_out_are_not_measured():
    calls = []
    result = trials.search_batch_size(
        _fake_measure(RATES, calls=calls), list(RATES),
        fits=lambda size: "the plan needs 30 GB" if size >= 64 else None)
    assert calls == [16, 32] and result.batch_size == 32
    assert result.table[-1] == {"batch_size": 64, "status": "does not fit (plan)",
                                "note": "the plan needs 30 GB"}
    assert result.stopped == "size 64: the plan needs 30 GB"
    with pytest.raises(ConfigError, match=r"fits: 16 does not fit \(plan\): no; lower"):
        trials.search_batch_size(_fake_measure(RATES), [16, 32], fits=lambda size: "no")


def test_keeps_the_fastest_and_stops_when_throughput_stops_growing():
    calls = []
    result = trials.search_batch_size(_fake_measure(RATES, calls=calls), list(RATES),
                                      patience=2)
    assert result.batch_size == 128
    assert calls == [16, 32, 64, 128, 256, 512]  # two sizes without a gain, then stop


def test_nothing_fits():
    with pytest.raises(ConfigError, match="no batch size fits: 16 already ran out of memory"):
        trials.search_batch_size(_fake_measure(RATES, oom_from=16), [16, 32])


def test_candidate_sizes():
    assert trials.candidate_sizes(16, 100) == [16, 32, 64]
    with pytest.raises(ConfigError, match="range 64..32 is empty"):
        trials.candidate_sizes(64, 32)


def test_real_search_with_an_injected_out_of_memory():
    """Real trials of the digits MLP; an out-of-memory error is injected at 64."""
    splits = data.load_dataset("digits")
    model = models.build_model("mlp", splits.info.input_shape, splits.info.num_classes)
    before = [w.copy() for w in model.get_weights()]

    def measure(size):
        if size >= 64:
            raise tf.errors.ResourceExhaustedError(None, None, "injected OOM")
        return trials.measure_batch_size(model, splits.train, size, warmup=1, steps=3)

    result = trials.search_batch_size(measure, trials.candidate_sizes(16, 256))
    assert result.batch_size in (16, 32)
    ok = [r for r in result.table if r["status"] == "ok"]
    assert [r["batch_size"] for r in ok] == [16, 32]
    assert result.batch_size == max(ok, key=lambda r: r["examples_per_sec"])["batch_size"]
    for row in ok:
        rate = 1000 * row["batch_size"] / row["ms_per_step"]
        assert row["examples_per_sec"] == pytest.approx(rate)
        assert row["peak_memory_mb"] > 50  # the process's peak RSS
    assert result.table[-1]["status"] == "out of memory"
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))  # trials used copies


@pytest.mark.slow
def test_recipe_auto_batch_size_with_accumulation_and_monitor(tmp_path):
    model_dir = tmp_path / "run"
    proc = run_recipe("train", "--batch_size=auto", "--max_batch_size=64", "--grad_accum_steps=2",
                      "--epochs=1", "--monitor_every_n_steps=5", "--gpu_memory_limit=512",
                      f"--model_dir={model_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no GPU visible: a 512 MB memory limit ignored" in proc.stderr  # a warning, not a crash
    metrics = json.loads((model_dir / "metrics.json").read_text())
    table = metrics["batch_size_search"]
    assert [r["batch_size"] for r in table] == [16, 32, 64]
    best = max(table, key=lambda r: r["examples_per_sec"])["batch_size"]
    assert metrics["batch_size"] == 2 * best  # micro-batch x grad_accum_steps
    assert (f"--batch_size=auto chose {2 * best} (search "
            f"{metrics['batch_size_search_seconds']:.1f} s of a 60 s budget") in proc.stdout
    logs = model_dir / "logs" / "train"
    assert summaries.read_text_summaries(logs)["performance/batch_size_search"].count("| ok |") == 3
    scalars = summaries.read_scalars(logs)
    assert scalars["memory/peak_rss_mb"][0][1] > 50
    steps = -(-1257 // (2 * best))
    assert [s for s, _ in scalars["monitor/rss_mb"]] == list(range(5, steps + 1, 5))


@pytest.mark.parametrize("flag,line", [
    ("--batch_size=abc", "--batch_size=abc: 'abc' is not a batch size: use a positive integer, "
                         "e.g. 64, or 'auto' to measure the fastest that fits"),
    ("--precision=fp8", "--precision=fp8: use one of float32, mixed_float16, mixed_bfloat16, "
                        "auto"),
    ("--auto_budget_seconds=-5", "--auto_budget_seconds=-5 is not a time budget: give seconds > "
                                 "0, or 0 for the default (10% of one epoch or 60 s)"),
])
def test_recipe_rejects_bad_flags(tmp_path, flag, line):
    check_flag_error("train", flag, f"--model_dir={tmp_path / 'run'}", line=line)
    assert not (tmp_path / "run").exists()


def test_batch_size_flag_takes_an_integer_or_auto():
    sys.path.insert(0, RECIPES)
    import common

    parser = common.BatchSizeParser(allow_auto=True)
    assert parser.parse("auto") == "auto" and parser.parse(" AUTO ") == "auto"
    assert parser.parse("64") == 64 and parser.parse(64) == 64
    for bad in ("abc", "0", "-3", "1.5", True):
        with pytest.raises(ValueError, match="is not a batch size: use a positive integer"):
            parser.parse(bad)
    with pytest.raises(ValueError, match="e.g. 64$"):
        common.BatchSizeParser(allow_auto=False).parse("auto")


def test_choose_fastest_with_injected_timings():
    base = ("float32", False)
    assert trials.choose_fastest({base: 1.0, ("mixed_float16", False): 0.5}) == (
        "mixed_float16", False)
    assert trials.choose_fastest({base: 1.0, ("mixed_float16", False): 1.2,
                                  ("float32", True): 1.01}) == base
    assert trials.choose_fastest({base: 1.0, ("float32", True): 0.95}, min_speedup=1.1) == base
    with pytest.raises(ConfigError, match="baseline"):
        trials.choose_fastest({("float32", True): 1.0})


class FakeMachine:
    """`measure` for `trials.search_settings` on a made-up machine, on a fake clock.

    `step`: full-batch seconds per step of each setting; the first steps run a
    32nd of the batch (`first`, default step/32); a fit call's first step adds
    `trace` seconds (plus `compile` with XLA) on each new shape, and a setting's
    first call `copy` seconds (cloning and compiling the copy). `hiccup`: seconds
    added to a setting's second small-batch step.
    """

    def __init__(self, step, first=None, trace=1.0, compile=0.0, copy=0.2, hiccup=None):
        self.now, self.step, self.calls, self.released = 0.0, step, [], []
        self.first = first or {k: v / 32 for k, v in step.items()}
        self.trace, self.compile, self.copy, self.shapes = trace, compile, copy, set()
        self.hiccup, self.small_steps = dict(hiccup or {}), {}

    def clock(self):
        return self.now

    def __call__(self, key, kind, steps, deadline):
        assert keras.mixed_precision.global_policy().name == key[0]  # run under its policy
        self.calls.append((key, kind, steps))
        if not any(k == key for k, _ in self.shapes):
            self.now += self.copy
        shape = "small" if kind == trials.FIRST else "full"
        seconds = []
        for i in range(steps):
            t = self.first[key] if shape == "small" else self.step[key]
            if i == 0 and (key, shape) not in self.shapes:
                t += self.trace + (self.compile if key[1] else 0.0)
                self.shapes.add((key, shape))
            if shape == "small":
                self.small_steps[key] = self.small_steps.get(key, 0) + 1
                t += self.hiccup.get(key, 0.0) if self.small_steps[key] == 2 else 0.0
            self.now += t
            seconds.append(t)
            if self.now >= deadline:
                break
        return seconds

    def release(self, key):
        self.released.append(key)

    def kinds(self, key):
        return [kind for k, kind, _ in self.calls if k == key]


F32, F16, BF16 = ("float32", False), ("mixed_float16", False), ("mixed_bfloat16", False)
F32_XLA, F16_XLA, BF16_XLA = ("float32", True), ("mixed_float16", True), ("mixed_bfloat16", True)
# Flags of the two kinds of CPU: a Xeon with AMX (bf16, int8, AVX512_FP16) and one without.
AMX_CPU = {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile",
           "amx_bf16", "amx_int8"}
PLAIN_CPU = {"avx2", "fma"}
# Step times (s) of the zoo CNN at 32x32x3, batch 256, as measured on each kind.
AMX_STEPS = {F32: 0.174, BF16: 0.086, F16: 38.0, F32_XLA: 0.25, BF16_XLA: 0.2, F16_XLA: 30.0}
PLAIN_STEPS = {F32: 0.20, BF16: 0.45, F16: 0.9, F32_XLA: 0.5, BF16_XLA: 0.4, F16_XLA: 0.8}


def _search(machine, cpu_flags, **kwargs):
    return trials.search_settings(
        machine, batch_size=256, clock=machine.clock, **kwargs,
        advice=lambda name: precision.precision_advice(name, gpus=[], cpu_flags=cpu_flags))


def _rows(choice):
    return {(r["precision"], r["jit_compile"]): r for r in choice.table}


def test_amx_cpu_picks_bfloat16_and_drops_float16_at_its_first_steps():
    machine = FakeMachine(AMX_STEPS)
    choice = _search(machine, AMX_CPU, steps_per_epoch=40)
    assert (choice.precision, choice.jit_compile) == ("mixed_bfloat16", False)
    rows = _rows(choice)
    assert list(rows) == [F32, F16, BF16, BF16_XLA]  # precisions, then XLA for the winner
    # float16 ran only two small-batch steps (far over the limit: no second look), never a
    # full-batch (38 s) one; float32 ran three, for its reference.
    assert [c for c in machine.calls if c[1] == trials.FIRST][:2] == [
        (F32, trials.FIRST, 3), (F16, trials.FIRST, 2)]
    assert machine.kinds(F16) == [trials.FIRST]
    assert rows[F16]["status"] == "dropped" and "ms_per_step" not in rows[F16]
    assert "first steps 218x slower than float32's (limit 10x)" in rows[F16]["note"]
    assert "mixed_float16 has no fast path on CPUs" in rows[F16]["note"]  # the CPU's advice
    assert "float16 math is not used" in rows[F16]["note"]  # it has AVX512_FP16, unused
    assert rows[BF16]["speedup"] == pytest.approx(0.174 / 0.086)
    assert rows[BF16]["examples_per_sec"] == pytest.approx(256 / 0.086)
    assert rows[BF16]["note"] == ""  # bf16 hardware: no warning
    assert rows[BF16]["rounds"] == 6 and rows[F32]["rounds"] == 3  # stage 1, then against XLA
    assert {r["status"] for k, r in rows.items() if k != F16} == {"measured"}
    # Every cost is on the clock and within the budget: 60 s (an epoch of 40 steps is 7 s).
    assert choice.budget_seconds == 60
    assert choice.seconds == pytest.approx(machine.now)
    assert choice.seconds == pytest.approx(sum(r["seconds"] for r in choice.table))
    assert choice.seconds < choice.budget_seconds
    assert machine.released[-1] is None and F16 in machine.released  # copies let go


def test_cpu_without_bf16_keeps_float32_and_says_why():
    machine = FakeMachine(PLAIN_STEPS)
    choice = _search(machine, PLAIN_CPU)
    assert (choice.precision, choice.jit_compile) == ("float32", False)
    rows = _rows(choice)
    assert list(rows) == [F32, F16, BF16, F32_XLA]
    assert [r["speedup"] for r in choice.table] == pytest.approx([1, 0.2 / 0.9, 0.2 / 0.45,
                                                                  0.2 / 0.5])
    # float16 (4.5x slower) cannot win: dropped after its first round, not timed again.
    assert rows[F16]["status"] == "dropped" and rows[F16]["rounds"] == 1
    assert "4.5x slower than the fastest after round 1 (limit 3x)" in rows[F16]["note"]
    assert "no bfloat16 instructions" in rows[BF16]["note"]
    assert rows[BF16]["status"] == "measured" and rows[BF16]["rounds"] == 3


def test_a_hiccup_in_the_first_steps_does_not_drop_a_setting():
    # bfloat16's second small step hits a 15x hiccup: two more steps show its real pace.
    machine = FakeMachine(AMX_STEPS, hiccup={BF16: 15 * AMX_STEPS[F32] / 32})
    choice = _search(machine, AMX_CPU, jit_options=(False,))
    assert [n for k, kind, n in machine.calls if k == BF16 and kind == trials.FIRST] == [2, 2]
    assert (choice.precision, choice.jit_compile) == ("mixed_bfloat16", False)
    # A setting really 15x slower is looked at twice, then dropped.
    machine = FakeMachine({**PLAIN_STEPS, BF16: 15 * PLAIN_STEPS[F32]})
    choice = _search(machine, PLAIN_CPU, jit_options=(False,))
    assert machine.kinds(BF16) == [trials.FIRST, trials.FIRST]
    assert _rows(choice)[BF16]["status"] == "dropped"
    assert "first steps 15x slower than float32's (limit 10x)" in _rows(choice)[BF16]["note"]


def test_first_step_batch_is_a_small_multiple_of_the_replicas_and_micro_batches():
    assert batch_search.first_step_batch(256) == 8
    assert batch_search.first_step_batch(64, multiple=4) == 4
    assert batch_search.first_step_batch(96, multiple=6) == 6  # 96/16: 96/32 is no multiple of 6
    assert batch_search.first_step_batch(7) == 7


def test_each_setting_gets_its_share_of_the_budget():
    # XLA compiles for 9 s per shape: its first steps (compile included) already spend
    # more than its 20 s share would leave for a full-batch warm-up.
    machine = FakeMachine(PLAIN_STEPS, compile=9.0)
    choice = _search(machine, PLAIN_CPU, budget_seconds=40, precisions=("float32",))
    rows = _rows(choice)
    assert list(rows) == [F32, F32_XLA] and choice.budget_seconds == 40
    assert rows[F32_XLA]["status"] == "budget spent" and "ms_per_step" not in rows[F32_XLA]
    assert "its full-batch warm-up would take about" in rows[F32_XLA]["note"]
    assert machine.kinds(F32_XLA) == [trials.FIRST]
    assert (choice.precision, choice.jit_compile) == ("float32", False)
    assert all(r["seconds"] <= 20 for r in choice.table)
    # A budget too small for full rounds: the settings keep what they measured.
    machine = FakeMachine(PLAIN_STEPS)
    choice = _search(machine, PLAIN_CPU, budget_seconds=9, jit_options=(False,))
    # Each overshoots its 3 s share by at most the one step that was running.
    assert all(r["seconds"] <= 3 + PLAIN_STEPS[r["precision"], r["jit_compile"]]
               for r in choice.table)
    assert {r["status"] for r in choice.table} == {"budget spent"}
    assert "ms_per_step" in choice.table[0]  # the baseline keeps its warm-up's steps
    assert "share spent before a timed round" in choice.table[1]["note"]
    assert choice.seconds <= 9 + max(PLAIN_STEPS.values())
    assert (choice.precision, choice.jit_compile) == ("float32", False)


def test_under_heavy_load_a_setting_is_not_started_when_it_cannot_fit():
    # Every trace takes 30 s (a loaded machine): float32's first steps alone spend more than
    # the whole 20 s budget, so no other setting starts (a step cannot be cut short).
    machine = FakeMachine(PLAIN_STEPS, trace=30.0)
    choice = _search(machine, PLAIN_CPU, budget_seconds=20)
    rows = _rows(choice)
    assert list(rows) == [F32, F16, BF16, F32_XLA]
    assert [k for k, _, _ in machine.calls] == [F32, F32]  # its first steps, its warm-up
    assert "over the trials' whole 20 s budget: no other setting tried" in rows[F32]["note"]
    for key in (F16, BF16, F32_XLA):
        assert rows[key]["status"] == "budget spent" and rows[key]["seconds"] == 0
        assert rows[key]["note"].startswith("not tried: the trials' 20 s budget was spent")
    assert choice.seconds == pytest.approx(rows[F32]["seconds"])
    assert (choice.precision, choice.jit_compile) == ("float32", False)
    # Its timing is a steady step's, not the traced one's, so the default budget (a tenth of
    # an epoch of 400 steps, or 60 s) is not inflated by a 30 s trace.
    assert rows[F32]["ms_per_step"] == pytest.approx(1000 * PLAIN_STEPS[F32])
    choice = _search(FakeMachine(PLAIN_STEPS, trace=30.0), PLAIN_CPU, steps_per_epoch=400)
    assert choice.budget_seconds == 60
    # 8 s traces: float32's first steps (8.2 s) exceed each 5 s share: nothing else starts.
    machine = FakeMachine(PLAIN_STEPS, trace=8.0)
    choice = _search(machine, PLAIN_CPU, budget_seconds=20)
    rows = _rows(choice)
    assert {k for k, _, _ in machine.calls} == {F32}
    assert "first steps took 8.2 s, more than this setting's 5.0 s share" in rows[BF16]["note"]


def test_default_budget_is_a_tenth_of_an_epoch_or_60_seconds():
    steps = {**PLAIN_STEPS, F32: 2.0}
    choice = _search(FakeMachine(steps), PLAIN_CPU, steps_per_epoch=5000, jit_options=(False,))
    assert choice.budget_seconds == pytest.approx(0.1 * 5000 * 2.0)
    assert _search(FakeMachine(steps), PLAIN_CPU, jit_options=(False,)).budget_seconds == 60
    unlimited = _search(FakeMachine(steps), PLAIN_CPU, budget_seconds=None, jit_options=(False,))
    assert unlimited.budget_seconds == float("inf")
    with pytest.raises(ConfigError, match="budget_seconds=0 is not a time budget"):
        _search(FakeMachine(steps), PLAIN_CPU, budget_seconds=0)


def test_a_fixed_precision_times_only_xla_on_and_off():
    machine = FakeMachine(AMX_STEPS)
    choice = _search(machine, AMX_CPU, precisions=("mixed_bfloat16",))
    assert list(_rows(choice)) == [BF16, BF16_XLA]
    assert (choice.precision, choice.jit_compile) == ("mixed_bfloat16", False)


def test_rounds_of_a_slower_setting_are_cut():
    machine = FakeMachine({F32: 0.010, F16: 0.050, BF16: 0.011})
    choice = _search(machine, PLAIN_CPU, jit_options=(False,), steps=7, warmup=4)
    assert [(k, n) for k, kind, n in machine.calls if kind == trials.WARMUP] == [
        (F32, 4), (F16, 4), (BF16, 4)]
    # 7 timed steps per round (+1 untimed); float16's round is cut to what fits in 3x float32's
    # (3 * 7 * 10 ms = 210 ms: 4 steps of 50 ms), then it is dropped (5x slower).
    assert [(k, n) for k, kind, n in machine.calls if kind == trials.ROUND] == [
        (F32, 8), (F16, 5), (BF16, 8), (F32, 8), (BF16, 8), (F32, 8), (BF16, 8)]
    assert {r["precision"]: r["rounds"] for r in choice.table} == {
        "float32": 3, "mixed_float16": 1, "mixed_bfloat16": 3}
    assert (choice.precision, choice.jit_compile) == ("float32", False)


def test_real_auto_select_on_copies(tmp_path):
    """Real trials of a tiny MLP: the table's numbers are its own, the model is untouched.
    The budget is wide, so that both rounds run even where a loaded machine takes a minute
    to copy and trace (a CI run beside other work: float32 kept 1 round of 2 at 120 s)."""
    budget = 1200
    model = models.build_model("mlp", (8, 8, 1), 10, hidden=(8,))
    before = [w.copy() for w in model.get_weights()]
    x = tf.random.uniform((256, 8, 8, 1))
    y = tf.random.uniform((256,), maxval=10, dtype=tf.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32, drop_remainder=True)
    choice = trials.auto_select(model, dataset, 32, precisions=("float32", "mixed_bfloat16"),
                                jit_options=(False,), steps=3, rounds=2,
                                budget_seconds=budget,
                                gpus=[], cpu_flags=PLAIN_CPU)
    rows = _rows(choice)
    assert list(rows) == [F32, BF16]
    assert (choice.precision, choice.jit_compile) == trials.choose_fastest(
        {k: r["ms_per_step"] for k, r in rows.items() if "ms_per_step" in r},
        min_speedup=trials.MIN_SPEEDUP)
    assert rows[F32]["speedup"] == 1 and rows[F32]["rounds"] == 2
    assert 0 < choice.seconds < budget and choice.budget_seconds == budget
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))
    assert keras.mixed_precision.global_policy().name == "float32"


def test_batch_size_search_stops_when_its_budget_is_spent():
    clock = [0.0]

    def measure(size):  # a size costs size/16 seconds
        clock[0] += size / 16
        return _fake_measure(RATES)(size)

    result = trials.search_batch_size(measure, list(RATES), budget_seconds=10,
                                      clock=lambda: clock[0])
    # 16, 32 and 64 took 7 s; 128 would take about 8 s of the 3 s left: not started.
    assert [(r["batch_size"], r["status"]) for r in result.table] == [
        (16, "ok"), (32, "ok"), (64, "ok"), (128, "not tried")]
    assert result.batch_size == 64 and result.seconds == 7 and result.budget_seconds == 10
    assert result.stopped == "time budget of 10 s: 3 s left, size 128 would take about 8 s"
    assert result.table[-1]["note"] == result.stopped
    # The default budget: 10% of an epoch at the best throughput so far, at least 60 s.
    clock[0] = 0.0
    result = trials.search_batch_size(measure, list(RATES), budget_seconds="default",
                                      num_examples=350 * 800, clock=lambda: clock[0])
    assert result.budget_seconds == pytest.approx(0.1 * 800) and result.batch_size == 128
    assert result.stopped == "2 sizes in a row without a faster one"


@pytest.mark.slow
def test_recipe_auto_finishes_within_its_budget_and_keeps_the_fastest(tmp_path):
    # The rule, on any CPU: the trials end within the budget they state, and the setting kept is
    # the fastest of those the table shows timed, unless nothing beat float32 without XLA by
    # MIN_SPEEDUP. (Without bf16 hardware that is float32; on a CPU with AMX, mixed_bfloat16.)
    model_dir = tmp_path / "run"
    proc = run_recipe("train", "--precision=auto", "--jit_compile=auto", "--epochs=1",
                      "--dataset=synthetic", "--synthetic_shape=16,16,3",
                      "--synthetic_examples=512", "--batch_size=64", "--monitor_every_n_steps=0",
                      f"--model_dir={model_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    table = metrics["auto_precision_trials"]
    # An epoch of 8 steps: the default budget is its floor, 60 s.
    assert metrics["auto_precision_budget_seconds"] == batch_search.MIN_BUDGET_SECONDS
    assert metrics["auto_precision_seconds"] <= metrics["auto_precision_budget_seconds"]
    assert sum(r["seconds"] for r in table) <= metrics["auto_precision_seconds"]
    timings = {(t["precision"], t["jit_compile"]): t["ms_per_step"] for t in table
               if "ms_per_step" in t}
    baseline = timings[trials.BASELINE]
    for t in table:
        assert t["status"] in (trials.MEASURED, trials.BUDGET_SPENT, trials.DROPPED), t
        assert t["status"] == trials.MEASURED or t["note"], t  # a reason for any other
        if "ms_per_step" in t:
            assert t["speedup"] == pytest.approx(baseline / t["ms_per_step"], rel=1e-6), t
            assert t["examples_per_sec"] == pytest.approx(64000 / t["ms_per_step"], rel=1e-6)
    # Stage 1: every precision this hardware could gain from, without XLA (the others are
    # skipped with the advice against them); stage 2: XLA for the stage-1 winner.
    candidates = precision.auto_candidates()
    assert candidates[0] == "float32"
    assert [t["precision"] for t in table[:len(candidates)]] == list(candidates)
    for name in set(precision.PRECISIONS) - set(candidates):
        assert f"precision trials skip {name}: {precision.precision_advice(name)[0]}" in proc.stdout
    stage1 = {k: v for k, v in timings.items() if not k[1]}
    winner = trials.choose_fastest(stage1, min_speedup=trials.MIN_SPEEDUP)
    assert [(t["precision"], t["jit_compile"]) for t in table[len(candidates):]] == [
        (winner[0], True)]
    chosen = (metrics["precision"], metrics["jit_compile"])
    assert chosen == trials.choose_fastest(timings, min_speedup=trials.MIN_SPEEDUP), table
    assert timings[chosen] <= baseline  # never slower than float32 as measured
    assert (f"auto chose precision {chosen[0]}, jit_compile {chosen[1]} (trials "
            f"{metrics['auto_precision_seconds']:.1f} s of a 60 s budget)") in proc.stdout
    assert "| float32 | False |" in proc.stdout  # the measured table, in the log
    texts = summaries.read_text_summaries(model_dir / "logs" / "train")
    assert texts["performance/auto_precision"].count("\n") == len(table) + 1
    assert "| status |" in texts["performance/auto_precision"]
    images = summaries.read_image_tags(model_dir / "logs" / "train")
    assert "performance/auto_precision_plot" in images
    assert (model_dir / "auto_precision.png").stat().st_size > 1000
