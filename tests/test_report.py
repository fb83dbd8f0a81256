"""tfaccel.compress.report: ratios against the baseline, the plot, and the report in files and
TensorBoard."""

import json

import pytest

from tfaccel import errors, summaries
from tfaccel.compress import report

MEASURED = [
    {"variant": "float", "accuracy": 0.98, "bytes": 600, "gzip_bytes": 500, "latency_p50_us": 50.0},
    {"variant": "int8", "accuracy": 0.975, "bytes": 160, "gzip_bytes": 125, "latency_p50_us": 40.0,
     "description": "PTQ int8"},
]


def test_ratios_against_the_baseline():
    rows = report.comparison_rows(MEASURED, "float", reference_accuracy=0.99)
    int8 = rows[1]
    assert int8["gzip_ratio"] == 4.0 and int8["speedup"] == 1.25
    assert int8["accuracy_change_points"] == pytest.approx(-1.5)
    assert rows[0]["gzip_ratio"] == 1.0
    assert report.comparison_rows(MEASURED)[1]["accuracy_change_points"] == pytest.approx(-0.5)


def test_bad_measurements():
    with pytest.raises(errors.ConfigError, match="baseline variant 'fp32'"):
        report.comparison_rows(MEASURED, "fp32")
    with pytest.raises(errors.ConfigError, match="lacks gzip_bytes"):
        report.comparison_rows([{"variant": "x", "accuracy": 1, "bytes": 1, "latency_p50_us": 1}])


def test_report_files_and_tensorboard(tmp_path):
    rows = report.comparison_rows(MEASURED)
    paths = report.write_report(tmp_path, tmp_path / "logs", rows, {"model": "cnn"},
                                reference_accuracy=0.98, step=3)
    saved = json.loads((tmp_path / "report.json").read_text())
    assert (saved["model"] == "cnn"
            and [r["variant"] for r in saved["variants"]] == ["float", "int8"])
    assert (tmp_path / "report.png").read_bytes()[:4] == b"\x89PNG"
    markdown = (tmp_path / "report.md").read_text()
    assert "| int8 | 0.975 |" in markdown and "PTQ int8" in markdown
    assert "| int8 | 0.975 |" in summaries.read_text_summaries(tmp_path / "logs")["report/table"]
    assert summaries.read_image_tags(tmp_path / "logs") == ["report/accuracy_vs_size"]
    assert paths["png"] == str(tmp_path / "report.png")
