"""compress.latency: the one latency harness (warm-up, interleaved rounds, statistics)."""

import pytest

from tfaccel import errors, monitor
from tfaccel.compress import latency


def test_latency_stats_in_microseconds():
    times = monitor.StepTimes(seconds=(4e-6, 1e-6, 3e-6, 2e-6), warmup_seconds=(1.0,))
    assert latency.latency_stats(times) == pytest.approx(
        {"mean_us": 2.5, "p50_us": 2.5, "p90_us": 3.7, "num_runs": 4})


def test_models_are_warmed_up_then_timed_in_interleaved_rounds():
    calls = []

    def one_call(model):
        calls.append(f"prepare {model}")
        return lambda: calls.append(model)

    stats = latency.compare_latencies({"a": "A", "b": "B"}, one_call, num_runs=7, warmup=2,
                                      rounds=2)
    assert calls == ["prepare A", "prepare B", "A", "A", "B", "B",  # warm-up, untimed
                     "A", "A", "A", "B", "B", "B", "A", "A", "A", "B", "B", "B"]  # 7 // 2 a round
    assert sorted(stats) == ["a", "b"]
    for s in stats.values():
        assert set(s) == {"mean_us", "p50_us", "p90_us", "num_runs"}
        assert s["num_runs"] == 6 and 0 < s["p50_us"] <= s["p90_us"]


def test_at_least_one_run_a_round():
    stats = latency.compare_latencies({"a": None}, lambda model: lambda: None, num_runs=2,
                                      warmup=0, rounds=5)
    assert stats["a"]["num_runs"] == 5


@pytest.mark.parametrize("bad", [{"num_runs": 0}, {"warmup": -1}, {"rounds": 0}])
def test_bad_counts_fail_before_any_model_is_prepared(bad):
    prepared = []
    with pytest.raises(errors.ConfigError, match="need num_runs >= 1, warmup >= 0, rounds >= 1"):
        latency.compare_latencies({"a": "A"}, prepared.append, **bad)
    assert prepared == []
