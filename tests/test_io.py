"""tfaccel.io: results appear whole or not at all."""

import gzip
import json
import os

import numpy as np
import pytest

from tfaccel import io


def test_atomic_file_replaces_only_on_success(tmp_path):
    path = tmp_path / "out" / "report.json"
    io.write_json(path, {"a": 1, "x": np.float32(0.5)})
    assert json.loads(path.read_text()) == {"a": 1, "x": 0.5}
    with pytest.raises(RuntimeError):
        with io.atomic_path(path) as tmp:
            with open(tmp, "w") as f:
                f.write("half")
            raise RuntimeError("crash while writing")
    assert json.loads(path.read_text()) == {"a": 1, "x": 0.5}
    assert os.listdir(path.parent) == ["report.json"]


def test_atomic_dir_and_suffix(tmp_path):
    final = tmp_path / "saved_model"
    for content in ("first", "second"):
        with io.atomic_path(final) as tmp:
            os.makedirs(tmp)
            (open(os.path.join(tmp, "f.txt"), "w")).write(content)
    assert (final / "f.txt").read_text() == "second"
    assert sorted(os.listdir(tmp_path)) == ["saved_model"]
    with io.atomic_path(tmp_path / "model.keras") as tmp:
        assert tmp.endswith(".keras")
        open(tmp, "w").write("x")
    assert (tmp_path / "model.keras").exists()


def test_nothing_written_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        with io.atomic_path(tmp_path / "x.bin"):
            pass
    assert not (tmp_path / "x.bin").exists()


def test_sizes(tmp_path):
    data = bytes(10_000)
    io.write_bytes(tmp_path / "zeros.bin", data)
    assert io.file_size(tmp_path / "zeros.bin") == 10_000
    assert io.gzipped_size(tmp_path / "zeros.bin") == len(gzip.compress(data, 9, mtime=0))
    assert io.gzipped_size(tmp_path / "zeros.bin") < 200
    assert io.file_size(tmp_path) == 10_000
    assert io.gzipped_size(tmp_path) > 0
