"""tfaccel.launch: local multi-worker runs on 127.0.0.1.

Fast tests drive the launcher with tiny Python workers; slow tests run the
train recipe as real MultiWorkerMirroredStrategy workers. Every wait is
bounded; ports are picked free by the OS.
"""

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from tfaccel.distribute import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "recipes", "train.py")
CLUSTER_VARS = ("TF_CONFIG", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS")


def mlp_without_dropout(input_shape, num_classes):
    """A dropout-free model for --model_fn, so that replicas and one worker compute the same."""
    from tfaccel.train.models import build_model

    return build_model("mlp", input_shape, num_classes, hidden=(64,), dropout=0)


def _env():
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    return env


def _script(tmp_path, body):
    path = tmp_path / "worker.py"
    path.write_text("import json, os, signal, sys, time\n"
                    "INDEX = json.loads(os.environ['TF_CONFIG'])['task']['index']\n" + body)
    return str(path)


class _Output:
    """Collects a process's output lines in a thread so that tests can wait for one, bounded."""

    def __init__(self, proc):
        self.lines = []
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream):
        for line in iter(stream.readline, ""):
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = re.search(pattern, line)
                if match:
                    return match
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n"
                             + "\n".join(self.lines[-40:]))

    def text(self):
        self._thread.join(timeout=10)
        return "\n".join(self.lines)


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start_launcher(args, command, sigint_ignored=False):
    """The launcher in a process of its own; `sigint_ignored`: as a script's background job
    starts it, with SIGINT ignored, which its children inherit unless they reset it."""
    return subprocess.Popen([sys.executable, "-m", "tfaccel.launch", *args, "--", *command],
                            env=_env(), cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_ignore_sigint if sigint_ignored else None)


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# --- Fast: the launcher itself, with tiny workers.

def test_free_ports_and_tf_config():
    ports = launch.free_ports(3)
    assert len(set(ports)) == 3 and all(0 < p < 65536 for p in ports)
    config = json.loads(launch.tf_config(ports, 2))
    assert config == {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                      "task": {"type": "worker", "index": 2}}
    assert launch.python_command(["train.py", "--x"]) == [sys.executable, "train.py", "--x"]
    assert launch.python_command(["-m", "pkg"]) == [sys.executable, "-m", "pkg"]
    assert launch.python_command(["-c", "pass"]) == [sys.executable, "-c", "pass"]
    assert launch.python_command(["echo", "hi"]) == ["echo", "hi"]


def test_each_worker_gets_its_tf_config_and_prefixed_output(tmp_path):
    script = _script(tmp_path, "print('task', INDEX, 'of', json.loads(os.environ['TF_CONFIG'])"
                               "['cluster']['worker'])\n")
    out = io.StringIO()
    code = launch.launch([script, "--flag"], 3, env=_env(), timeout=60, out=out)
    assert code == 0
    lines = out.getvalue().splitlines()
    clusters = set()
    for i in range(3):
        line = next(line for line in lines if line.startswith(f"[worker {i}] task {i} of "))
        clusters.add(line.split(" of ", 1)[1])
    assert len(clusters) == 1  # every worker sees the same cluster
    addresses = eval(clusters.pop())
    assert [a.split(":")[0] for a in addresses] == ["127.0.0.1"] * 3
    assert len({a.split(":")[1] for a in addresses}) == 3
    assert lines[-1] == "launch: all 3 worker(s) finished"


def test_a_failing_worker_stops_the_others_and_is_named(tmp_path):
    # Worker 0 ignores SIGTERM, like a MultiWorkerMirroredStrategy worker waiting for its peer.
    script = _script(tmp_path, """
if INDEX == 1:
    time.sleep(0.5)
    sys.exit(3)
signal.signal(signal.SIGTERM, lambda *a: print("SIGTERM ignored", flush=True))
print("waiting", flush=True)
time.sleep(600)
""")
    out = io.StringIO()
    start = time.monotonic()
    code = launch.launch([script], 2, env=_env(), grace_seconds=1, timeout=120, out=out)
    elapsed = time.monotonic() - start
    text = out.getvalue()
    assert code == 3
    assert elapsed < 30
    assert re.search(r"launch: worker 1 \(pid \d+\) exited with code 3; stopping the 1 other", text)
    assert "[worker 0] SIGTERM ignored" in text
    assert re.search(r"launch: worker 0 \(pid \d+\) still running after 1s: sending SIGKILL", text)
    assert text.splitlines()[-1] == "launch: failed: worker 1 exited with code 3"


def test_timeout_stops_everything(tmp_path):
    script = _script(tmp_path, "time.sleep(600)\n")
    out = io.StringIO()
    start = time.monotonic()
    code = launch.launch([script], 2, env=_env(), grace_seconds=1, timeout=1.5, out=out)
    assert code == launch.EXIT_TIMEOUT
    assert time.monotonic() - start < 30
    assert out.getvalue().splitlines()[-1] == "launch: failed: timeout after 1.5s"


@pytest.mark.parametrize("sigint_ignored", [False, True])
def test_ctrl_c_is_forwarded_to_every_worker(tmp_path, sigint_ignored):
    script = _script(tmp_path, """
print("ready", flush=True)
try:
    time.sleep(600)
except KeyboardInterrupt:
    print("worker", INDEX, "got Ctrl-C", flush=True)
    sys.exit(130)
""")
    proc = _start_launcher(["--workers", "2", "--timeout", "120"], [script], sigint_ignored)
    try:
        output = _Output(proc)
        output.wait_for(r"^\[worker 0\] ready", 60)
        output.wait_for(r"^\[worker 1\] ready", 60)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        _kill_group(proc)
    text = output.text()
    assert "[worker 0] worker 0 got Ctrl-C" in text and "[worker 1] worker 1 got Ctrl-C" in text
    assert "SIGKILL" not in text  # they stopped by themselves within the grace period


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0", "--", "x.py"], "--workers=0 must be at least 1"),
    (["--workers", "2"], "no command to launch"),
    (["--workers", "two", "--", "x.py"], "invalid int value: 'two'"),
    (["--", "x.py"], "the following arguments are required: --workers"),
    (["--workers", "2", "recipes/train.py"], "put the command after '--'"),
])
def test_bad_launcher_arguments_give_one_line(capsys, argv, message):
    assert launch.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_busy_port_base_is_refused(capsys):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert launch.main(["--workers", "1", "--port_base", str(port), "--", "x.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"port {port} on 127.0.0.1 is not free" in err[0]


# --- Slow: the train recipe as real MultiWorkerMirroredStrategy workers.

def _run_launcher(workers, args, timeout=400):
    proc = subprocess.run([sys.executable, "-m", "tfaccel.launch", "--workers", str(workers),
                           "--timeout", str(timeout - 30), "--", TRAIN, *args],
                          env=_env(), cwd=ROOT, text=True, capture_output=True, timeout=timeout)
    return proc


def _weights(path):
    from tfaccel.keras import keras

    return keras.models.load_model(path, compile=False).get_weights()


@pytest.mark.slow
def test_two_workers_match_one_worker(tmp_path):
    # 1024 examples / global batch 64: no partial batch, so both runs take the same 16 steps.
    flags = ["--dataset=synthetic", "--synthetic_examples=1024", "--batch_size=64", "--epochs=1",
             "--deterministic",  # the same batches in the same order in both runs
             "--optimizer=sgd", "--learning_rate=0.1", "--seed=3",
             "--model_fn=tests.test_launch:mlp_without_dropout"]
    two = _run_launcher(2, [*flags, "--strategy=multi_worker", f"--model_dir={tmp_path / 'two'}"])
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    assert "global batch 64 = 32 per replica x 2 replica(s)" in two.stdout
    one = subprocess.run([sys.executable, TRAIN, *flags, "--strategy=default",
                          f"--model_dir={tmp_path / 'one'}"], env=_env(), cwd=ROOT, text=True,
                         capture_output=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = _weights(tmp_path / "one" / "model.keras"), _weights(tmp_path / "two" / "model.keras")
    print("2 workers vs 1: largest weight difference",
          max(float(np.abs(x - y).max()) for x, y in zip(a, b)))
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
    accuracy = [json.loads((tmp_path / run / "metrics.json").read_text())["test_accuracy"]
                for run in ("one", "two")]
    assert accuracy[0] > 0.2, "no better than twice chance (0.1): the comparison would say little"
    assert accuracy[0] == pytest.approx(accuracy[1], abs=1e-6)


@pytest.mark.slow
def test_two_worker_digits_run_reaches_band_and_only_chief_writes(tmp_path):
    from tfaccel import summaries

    model_dir = tmp_path / "run"
    proc = _run_launcher(2, ["--strategy=multi_worker", "--epochs=8", "--learning_rate=3e-3",
                             f"--model_dir={model_dir}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    print("2-worker digits test accuracy", metrics["test_accuracy"])
    assert metrics["test_accuracy"] >= 0.95
    assert (metrics["distribution"]["replicas"] == 2
            and metrics["distribution"]["task"] == "worker:0")
    assert sorted(os.listdir(model_dir)) == ["checkpoints", "flags.cfg", "logs", "metrics.json",
                                             "model.keras", "saved_model"]
    # Only the chief's event files, and the test accuracy read back from them.
    assert summaries.read_scalars(model_dir / "logs" / "test")["test_accuracy"][-1][1] \
        == pytest.approx(metrics["test_accuracy"])
    assert not any("workertemp" in d for _, dirs, _ in os.walk(model_dir) for d in dirs)
    # Worker 1 wrote to a temporary directory, removed when it exited.
    other = re.search(r"^\[worker 1\] wrote (\S+):", proc.stdout, re.MULTILINE).group(1)
    assert other != str(model_dir) and not os.path.exists(other)
    # Rerun: every worker reads the finished run alike and trains nothing; --retrain trains
    # again on both (the chief's cleanup and the workers' reads kept apart by a barrier).
    before = (model_dir / "metrics.json").read_text()
    again = _run_launcher(2, ["--strategy=multi_worker", "--epochs=8", f"--model_dir={model_dir}"])
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("holds a finished run") == 2 and "Epoch 1/" not in again.stdout
    assert (model_dir / "metrics.json").read_text() == before
    retrained = _run_launcher(2, ["--strategy=multi_worker", "--epochs=1", "--retrain",
                                  f"--model_dir={model_dir}"])
    assert retrained.returncode == 0, retrained.stdout[-3000:] + retrained.stderr[-3000:]
    assert retrained.stdout.count("starting from epoch 1") == 2
    assert json.loads((model_dir / "metrics.json").read_text())["epochs"] == 1


@pytest.mark.slow
def test_killing_a_worker_fails_the_launch_within_30s(tmp_path):
    proc = _start_launcher(["--workers", "2", "--grace_seconds", "5", "--timeout", "300"],
                           [TRAIN, "--strategy=multi_worker", "--epochs=200",
                            f"--model_dir={tmp_path / 'run'}"])
    try:
        output = _Output(proc)
        pids = [int(output.wait_for(rf"^launch: worker {i} is pid (\d+)", 60).group(1))
                for i in range(2)]
        output.wait_for(r"^\[worker 1\] Epoch 1/200", 240)  # both connected and training
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        code = proc.wait(timeout=60)
        elapsed = time.monotonic() - killed
    finally:
        _kill_group(proc)
    text = output.text()
    print(f"launcher exited {code} {elapsed:.1f}s after worker 1 was killed")
    assert code != 0
    assert elapsed < 30, f"launcher took {elapsed:.1f}s to fail"
    assert "launch: failed: worker 1 was killed by SIGKILL" in text
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)  # the surviving worker was stopped too
