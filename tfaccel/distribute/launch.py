"""Run a multi-worker job on this machine: N worker processes on 127.0.0.1, each with its TF_CONFIG.

    tfaccel launch --workers 2 -- recipes/train.py --strategy=multi_worker --epochs=5
    python -m tfaccel.launch --workers 2 --port_base 23456 -- \\
        recipes/train.py --strategy=multi_worker

Each worker's output lines are prefixed with ``[worker i]``. Ctrl-C is
forwarded to every worker. When a worker fails, the others are stopped and the
launcher exits non-zero naming the worker; a worker that ignores SIGTERM
(MultiWorkerMirroredStrategy's preemption notifier swallows it, and a worker
whose peer died waits for it) is killed with SIGKILL after `grace_seconds`.

This is for local runs and tests. On a real cluster, set TF_CONFIG on each
machine (or let Slurm describe the cluster) and run the recipe directly.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from tfaccel.errors import ConfigError

HOST = "127.0.0.1"
EXIT_BAD_INPUT = 2
EXIT_TIMEOUT = 124


def free_ports(count, host=HOST):
    """`count` distinct TCP ports that are free on `host` right now (the OS picks them)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def check_ports_free(ports, host=HOST):
    """Raises ConfigError when one of `ports` cannot be bound on `host`."""
    for port in ports:
        if not 0 < port < 65536:
            raise ConfigError(f"port {port} is out of range: pick a --port_base so that "
                              "port_base + workers - 1 <= 65535")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError as e:
                raise ConfigError(f"port {port} on {host} is not free ({e.strerror}): pick another "
                                  "--port_base, or leave it out to use free ports") from None


def tf_config(ports, index, host=HOST):
    """The TF_CONFIG JSON of worker `index` in a cluster of workers on `host`:`ports`."""
    return json.dumps({"cluster": {"worker": [f"{host}:{p}" for p in ports]},
                       "task": {"type": "worker", "index": index}})


def python_command(command):
    """Prefixes this Python to a script (`x.py ...`), module (`-m pkg ...`) or `-c code` command."""
    if command and (command[0].endswith(".py") or command[0] in ("-m", "-c")):
        return [sys.executable, *command]
    return list(command)


def _describe_exit(code):
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _default_stop_signals():
    """In a worker, between fork and exec: SIGINT and SIGTERM back to their defaults. A
    launcher started where SIGINT is ignored (a script's background job, some CI runners)
    would otherwise hand that on, and the Ctrl-C it forwards would not stop the workers."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


class _Workers:
    """The worker processes, their prefixed output, and stopping them."""

    def __init__(self, command, ports, env, out):
        self.out = out
        self.lock = threading.Lock()
        self.procs, self.readers = [], []
        for i in range(len(ports)):
            worker_env = dict(env, TF_CONFIG=tf_config(ports, i), PYTHONUNBUFFERED="1")
            # A new session: Ctrl-C at the terminal reaches the launcher only, which forwards it.
            self.procs.append(subprocess.Popen(
                command, env=worker_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=_default_stop_signals))
        for i, proc in enumerate(self.procs):  # threads after the forks (see preexec_fn)
            reader = threading.Thread(target=self._pump, args=(i, proc.stdout), daemon=True)
            reader.start()
            self.readers.append(reader)

    def say(self, line):
        with self.lock:
            self.out.write(line if line.endswith("\n") else line + "\n")
            self.out.flush()

    def _pump(self, index, stream):
        for raw in iter(stream.readline, b""):
            self.say(f"[worker {index}] " + raw.decode("utf-8", errors="replace"))
        stream.close()

    def signal_all(self, sig):
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass

    def stop(self, grace_seconds, first_signal=signal.SIGTERM):
        """Sends `first_signal`, then SIGKILL to whatever still runs after `grace_seconds`."""
        self.signal_all(first_signal)
        deadline = time.monotonic() + grace_seconds
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.05)
        for i, proc in enumerate(self.procs):
            if proc.poll() is None:
                self.say(f"launch: worker {i} (pid {proc.pid}) still running after "
                         f"{grace_seconds:g}s: sending SIGKILL")
        self.signal_all(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
        for reader in self.readers:
            reader.join(timeout=5)


def launch(command, num_workers, *, port_base=None, grace_seconds=5.0, timeout=None, env=None,
           out=None):
    """Runs `command` as `num_workers` workers on 127.0.0.1 and waits for all of them.

    Example:

        code = launch(["recipes/train.py", "--strategy=multi_worker"], num_workers=2)

    Args:
      command: the program and its arguments; a `.py` script or `-m module` runs
        with this Python.
      num_workers: how many worker processes (>= 1).
      port_base: ports port_base..port_base+num_workers-1; None picks free ports.
      grace_seconds: how long a worker may take to stop before SIGKILL.
      timeout: seconds after which every worker is stopped and the launch fails (None: no limit).
      env: base environment of the workers (default: this process's).
      out: where prefixed output goes (default: sys.stdout).

    Returns:
      0 when every worker succeeded; the failed worker's exit code (or 1 when it
      was killed by a signal); 124 on timeout; 130 after Ctrl-C.

    Raises:
      ConfigError: no command, fewer than 1 worker, or ports that are not free.
    """
    if not command:
        raise ConfigError("no command to launch: put it after '--', e.g. "
                          "tfaccel launch --workers 2 -- recipes/train.py --strategy=multi_worker")
    if num_workers < 1:
        raise ConfigError(f"--workers={num_workers} must be at least 1")
    if grace_seconds < 0 or (timeout is not None and timeout <= 0):
        raise ConfigError(f"--grace_seconds={grace_seconds} must be >= 0 "
                          f"and --timeout={timeout} > 0")
    if port_base is None:
        ports = free_ports(num_workers)
    else:
        ports = list(range(port_base, port_base + num_workers))
        check_ports_free(ports)
    command = python_command(command)
    workers = _Workers(command, ports, dict(os.environ if env is None else env), out or sys.stdout)
    workers.say(f"launch: {num_workers} worker(s) on {', '.join(f'{HOST}:{p}' for p in ports)}: "
                f"{' '.join(command)}")
    for i, proc in enumerate(workers.procs):
        workers.say(f"launch: worker {i} is pid {proc.pid}")

    interrupted = []
    previous = {}

    def on_signal(signum, frame):
        if interrupted:  # a second Ctrl-C: stop waiting
            workers.signal_all(signal.SIGKILL)
        interrupted.append(signum)
        workers.signal_all(signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if interrupted:
                workers.say(f"launch: {signal.Signals(interrupted[0]).name} received: stopping "
                            "the workers")
                workers.stop(grace_seconds, first_signal=interrupted[0])
                return 128 + interrupted[0]
            codes = [p.poll() for p in workers.procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i = failed[0]
                running = sum(c is None for c in codes)
                workers.say(f"launch: worker {i} (pid {workers.procs[i].pid}) "
                            f"{_describe_exit(codes[i])}; stopping the {running} other running "
                            "worker(s)")
                workers.stop(grace_seconds)
                workers.say(f"launch: failed: worker {i} {_describe_exit(codes[i])}")
                return codes[i] if codes[i] > 0 else 1
            if all(c == 0 for c in codes):
                for reader in workers.readers:
                    reader.join(timeout=5)
                workers.say(f"launch: all {num_workers} worker(s) finished")
                return 0
            if deadline is not None and time.monotonic() > deadline:
                workers.say(f"launch: timeout after {timeout:g}s: stopping the workers")
                workers.stop(grace_seconds)
                workers.say(f"launch: failed: timeout after {timeout:g}s")
                return EXIT_TIMEOUT
            time.sleep(0.1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if any(p.poll() is None for p in workers.procs):  # an unexpected error above
            workers.stop(0)


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message} (see: tfaccel launch --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _parser():
    parser = _OneLineParser(
        prog="tfaccel launch",
        description="Run a command as N TensorFlow workers on 127.0.0.1, each with its TF_CONFIG.",
        epilog="example: tfaccel launch --workers 2 -- recipes/train.py --strategy=multi_worker")
    parser.add_argument("--workers", type=int, required=True, help="number of worker processes")
    parser.add_argument("--port_base", type=int, default=None,
                        help="first port (default: free ports picked by the OS)")
    parser.add_argument("--grace_seconds", type=float, default=5.0,
                        help="time a worker gets to stop before SIGKILL (default 5)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop everything and fail after this many seconds (default: none)")
    return parser


def main(argv=None):
    """`tfaccel launch` / `python -m tfaccel.launch`: `argv` is everything after 'launch'."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1:]
    else:
        own, command = argv, []
    try:
        args, extra = _parser().parse_known_args(own)
    except SystemExit as e:  # --help, or a bad option already reported in one line
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    if extra:
        print(f"error: unexpected arguments {' '.join(extra)!r}: put the command after '--', e.g. "
              "tfaccel launch --workers 2 -- recipes/train.py --strategy=multi_worker",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return launch(command, args.workers, port_base=args.port_base,
                      grace_seconds=args.grace_seconds, timeout=args.timeout)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
