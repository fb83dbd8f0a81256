"""tfaccel.quiet: TensorFlow imported without its start-up lines (issue #11, defect 13)."""

import os
import subprocess
import sys

import pytest

from tfaccel import quiet

# What TensorFlow 2.21 printed here on `import tensorflow` plus a first device query.
STARTUP = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796111938.506901    4265 port.cc:153] oneDNN custom operations are on.
I0000 00:00:1796111938.507202    4265 cudart_stub.cc:31] Could not find cuda drivers.
W0000 00:00:1796111938.600000    4265 some_module.cc:10] a warning
E0000 00:00:1796111941.519900    4265 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA \
error: Failed call to cuInit: UNKNOWN ERROR (303)
E0000 00:00:1796111941.600000    4265 other.cc:7] a real error
/x/y.py:3: DeprecationWarning: a Python warning
"""


@pytest.mark.parametrize("level, have_gpu, kept", [
    (2, False, ["a real error", "a Python warning"]),
    (2, True, ["failed call to cuInit", "a real error", "a Python warning"]),
    (1, False, ["a warning", "a real error", "a Python warning"]),
    (3, False, ["a Python warning"]),
    (0, False, ["All log messages", "oneDNN", "cuda drivers", "a warning", "failed call to cuInit",
                "a real error", "a Python warning"]),
])
def test_kept_lines_follow_the_log_level(level, have_gpu, kept):
    lines = quiet.kept_lines(STARTUP, level, have_gpu)
    assert len(lines) == len(kept)
    assert all(word in line for word, line in zip(kept, lines))


def _import_in_a_fresh_process(env_level):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if env_level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = env_level
    code = ("from tfaccel.quiet import import_tensorflow\n"
            "tf = import_tensorflow()\n"
            "tf.config.set_logical_device_configuration(tf.config.list_physical_devices('CPU')[0],"
            " [tf.config.LogicalDeviceConfiguration()] * 2)\n"  # still allowed after the import
            "print(len(tf.config.list_logical_devices('CPU')), float(tf.reduce_sum([1.0, 2.0])))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_import_tensorflow_prints_nothing_and_leaves_devices_configurable():
    proc = _import_in_a_fresh_process("2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "3.0"]
    assert proc.stderr == ""  # a plain `import tensorflow` prints 6-7 lines here


def test_level_0_keeps_every_start_up_line():
    proc = _import_in_a_fresh_process("0")
    assert proc.returncode == 0, proc.stderr
    assert "absl::InitializeLog" in proc.stderr  # nothing hidden from whoever asked for it all
