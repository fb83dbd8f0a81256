"""benchmarks/: each script runs end to end on a small input and reports what it measured."""

import json
import os
import subprocess
import sys

import pytest

from tfaccel import summaries

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_bench_data_measures_every_pipeline_over_whole_epochs(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_data.py"), "--num_images=96",
         "--source_size=48", "--image_size=32", "--batch_size=32", "--shards=2", "--repeats=1",
         f"--out_dir={out}", f"--data_dir={tmp_path / 'data'}"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # 1: a target missed at this toy size
    report = json.loads((out / "bench_data.json").read_text())
    assert report["config"]["host_allocator"] == "pooled"
    assert "host allocator pooled" in proc.stdout and "NOT IN EFFECT" not in proc.stdout
    names = list(report["best"])
    assert {"serial", "hand-optimized", "hand-optimized, autotune thread off", "tfaccel",
            "tfaccel cached", "tfaccel training mode", "tfaccel training mode cached"} <= set(names)
    for name in names:
        (run,) = report["runs"][name]
        assert run["images"] == 96  # every pipeline read the whole epoch, no more, no less
        assert run["rate"] > 0 and run["steady"] >= run["rate"] and run["teardown"] >= 0
        assert report["best"][name] == pytest.approx(run["rate"])
    ratios = report["ratios"]
    assert ratios["tfaccel / serial"] == pytest.approx(report["best"]["tfaccel"]
                                                       / report["best"]["serial"])
    assert [c["met"] for c in report["targets"]] == [
        c["measured"] >= float(c["target"].split(">=")[1]) for c in report["targets"]]
    assert proc.returncode == (0 if all(c["met"] for c in report["targets"]) else 1)
    assert (out / "bench_data.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    logdir = str(out / "logs")
    assert "tfaccel cached" in summaries.read_text(logdir)["bench_data/report"]
    assert "bench_data/tfaccel_cached_images_per_sec" in summaries.read_scalars(logdir)
    assert "bench_data/plot" in summaries.read_image_tags(logdir)
