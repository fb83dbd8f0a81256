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


def test_check_writable_dir_names_what_is_wrong_and_writes_nothing(tmp_path):
    from tfaccel.errors import ConfigError

    (tmp_path / "a_file").write_text("x")
    assert io.check_writable_dir(str(tmp_path / "new" / "deep"), "--model_dir")
    assert os.listdir(tmp_path) == ["a_file"]  # nothing created, no probe left
    with pytest.raises(ConfigError, match=r"--model_dir=.*a_file is a file, not a folder: give "
                       "a folder path"):
        io.check_writable_dir(str(tmp_path / "a_file"), "--model_dir")
    with pytest.raises(ConfigError, match="a_file is a file, not a folder: give a path whose "
                       "parents are folders"):
        io.check_writable_dir(str(tmp_path / "a_file" / "run"), "--model_dir")
    assert io.cannot_write(str(tmp_path)) is None
    assert os.listdir(tmp_path) == ["a_file"]


def test_check_writable_dir_is_refused_on_a_read_only_mount(tmp_path):
    """Root ignores modes; a read-only bind mount (own mount namespace) refuses even root."""
    import shutil
    import subprocess
    import sys

    if not shutil.which("unshare"):
        pytest.skip("no unshare here")
    folder = tmp_path / "ro"
    folder.mkdir()
    code = ("import sys; from tfaccel import io; from tfaccel.errors import ConfigError\n"
            "try: io.check_writable_dir(sys.argv[1] + '/run', '--model_dir')\n"
            "except ConfigError as e: print(e)")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", f'mount --bind -o ro "{folder}" '
                           f'"{folder}" && exec "$@"', "sh", sys.executable, "-c", code,
                           str(folder)], capture_output=True, text=True, check=False)
    if "mount" in proc.stderr:
        pytest.skip(f"cannot make a read-only bind mount here: {proc.stderr.strip()}")
    assert proc.stdout.strip() == (f"--model_dir={folder}/run: cannot write to {folder} (its first "
                                   "existing parent) (Read-only file system): give a folder you "
                                   "can write to")
    assert os.listdir(folder) == []
