"""pgqctl commands running in the background, workers above all: the one helper
every test that starts a `pgqctl worker` process (or another command's) uses.

- `PgqctlProcess`: `python -m pgqctl ARGS` in a process of its own, its stderr
  (the log) in a file and its stdout in another; read the log as text or as
  JSON events, wait for a line or an event, stop it with a signal, kill it
  (kill -9), or wait for its end and check it wrote nothing but log lines.
- Fixtures that start them and clean up after the test:
  `start_worker` (a worker with this environment, killed after the test),
  `start_json_worker` (the same, logging JSON, every line read back as an
  event), `start_pgqctl` (any command as a user would run it: from the
  repository root, no connection settings inherited; stopped with SIGTERM,
  then killed).
- `wait_until`, patient on a loaded machine; `wait_for_listener`, `wait_all`,
  `trouble`.

Test modules import the fixtures they use by name from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.servers import REPO_ROOT, clean_env

# How long a test waits for what it expects before it fails, whatever the
# time it names: on a machine busy with other work, a worker may take many
# times longer to start, claim or stop than on an idle one.
PATIENCE = 30.0

# Worker options for a log in JSON: each event's fields can be read back.
LOG_JSON = ("--log-format", "json")


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Wait for `predicate`, `timeout` seconds as the test expects, and up to
    PATIENCE on a loaded machine: only what never happens fails a test."""
    timeout = max(timeout, PATIENCE)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def _record(line: str) -> dict[str, Any]:
    """A JSON log line as its fields; anything else kept as its text."""
    try:
        record = json.loads(line)
    except ValueError:
        return {"event": None, "message": line}
    return record if isinstance(record, dict) else {"message": line}


def _hangup_as_by_default() -> None:
    # A suite run under nohup ignores SIGHUP, and a worker keeps an ignored
    # SIGHUP as it inherits it (as nohup asks): its processes here get the
    # default, as under a shell, so that SIGHUP tests judge the worker. The
    # same for SIGINT, which a suite started in the background ignores.
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class PgqctlProcess:
    """`pgqctl ARGS` in a process of its own, stderr (its log) and stdout in files.

    `env` None inherits this process's environment; `json_log` says the
    command was started with LOG_JSON, so that every log line must be an event.
    """

    def __init__(
        self,
        args: Sequence[str],
        log: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        json_log: bool = False,
    ) -> None:
        self.args = list(args)
        self.log_path = log
        self.out_path = log.with_suffix(".out")
        self.json_log = json_log
        with log.open("w") as err, self.out_path.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pgqctl", *self.args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=env,
                preexec_fn=_hangup_as_by_default,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The log's events (--log-format json), or those named `name`. Under
        `json_log` a line that is not JSON fails the test; otherwise it is
        kept as its text."""
        if self.json_log:
            found = [json.loads(line) for line in self.log_path.read_text().splitlines()]
            return [e for e in found if name is None or e["event"] == name]
        found = [_record(line) for line in self.log.splitlines()]
        return [e for e in found if name is None or e.get("event") == name]

    def wait_for(self, name: str, timeout: float = 10, **fields: Any) -> dict[str, Any]:
        """The first event named `name` with these fields, once it is logged."""

        def match() -> dict[str, Any] | None:
            for e in self.events(name):
                if all(e.get(k) == v for k, v in fields.items()):
                    return e
            return None

        wait_until(match, timeout, f"a {name} event {fields} in the log of pgqctl {self.args[0]}")
        found = match()
        assert found is not None
        return found

    def wait_for_log(self, text: str, timeout: float = PATIENCE) -> None:
        wait_until(
            lambda: text in self.log, timeout, f"{text!r} in the log of pgqctl {self.args[0]}"
        )

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM, and its exit code once it has stopped."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def wait(self, timeout: float) -> int:
        """Its exit code; killed (and the test failed) if it runs longer than `timeout`."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"pgqctl {' '.join(self.args)} still running after {timeout}s; "
                f"its log ends:\n{self.log[-3000:]}"
            ) from None
        return code

    def finish(self, timeout: float = 2 * PATIENCE) -> int:
        """Wait for it to exit; its exit code. It must never write to stdout."""
        code = self.proc.wait(timeout)
        assert self.out_path.read_text() == ""
        # Every line is a log line: no traceback, no stray output.
        for line in self.log_path.read_text().splitlines():
            assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", line), line
        return code

    def kill(self) -> None:
        """SIGKILL, and wait for it to be gone."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_all(processes: Sequence[PgqctlProcess], timeout: float) -> list[int]:
    """The exit codes of processes that must all end within `timeout` seconds, together."""
    deadline = time.monotonic() + timeout
    return [p.wait(max(deadline - time.monotonic(), 0.1)) for p in processes]


@contextlib.contextmanager
def _workers(tmp_path: Path, json_log: bool) -> Iterator[Callable[..., PgqctlProcess]]:
    started: list[PgqctlProcess] = []

    def start(
        dsn: str | None, *args: str, env: dict[str, str] | None = None, name: str = "worker"
    ) -> PgqctlProcess:
        command = ["worker", *(("--dsn", dsn) if dsn is not None else ())]
        if json_log:
            command += LOG_JSON
        worker = PgqctlProcess(
            [*command, *args],
            tmp_path / f"{name}-{len(started)}.log",
            env=env or dict(os.environ),
            json_log=json_log,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[Callable[..., PgqctlProcess]]:
    """Start `pgqctl worker [--dsn DSN] ARGS` with this environment (or `env`);
    whatever still runs is killed after the test."""
    with _workers(tmp_path, json_log=False) as start:
        yield start


@pytest.fixture
def start_json_worker(tmp_path: Path) -> Iterator[Callable[..., PgqctlProcess]]:
    """`start_worker` with a log in JSON: `events()` and `wait_for()` read it."""
    with _workers(tmp_path, json_log=True) as start:
        yield start


def web_address(web: PgqctlProcess) -> tuple[str, int]:
    """The host and port a `pgqctl web` process says it serves, once it says so
    (started with --port 0, it picks a free one)."""
    line = re.compile(r"serving the queue's page on http://\[?([^\]/]+?)\]?:(\d+)/")
    wait_until(lambda: line.search(web.log), 30, "pgqctl web to start serving")
    found = line.search(web.log)
    assert found is not None, web.log
    return found.group(1), int(found.group(2))


@pytest.fixture
def start_pgqctl(tmp_path: Path) -> Iterator[Callable[..., PgqctlProcess]]:
    """Start pgqctl commands in the background as a user would; whatever still
    runs is stopped with SIGTERM after the test, then killed."""
    started: list[PgqctlProcess] = []

    def start(*args: str, name: str = "pgqctl") -> PgqctlProcess:
        process = PgqctlProcess(
            args, tmp_path / f"{name}-{len(started)}.log", env=clean_env(), cwd=REPO_ROOT
        )
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            if process.proc.poll() is None:
                process.proc.send_signal(signal.SIGTERM)
        for process in started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.proc.wait(5)
            process.kill()


def wait_for_listener(conn: psycopg.Connection[Any]) -> None:
    """Wait until a worker on `conn`'s database listens for notifications."""
    wait_until(
        lambda: conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND query = 'LISTEN pgqctl_jobs'"  # the worker listens to cancels first
        ).fetchone(),
        10,
        "the worker to listen",
    )


# Log events that mean the worker lost its database or hit an unexpected error.
TROUBLE_EVENTS = frozenset(("db_lost", "db_restored", "error"))
TROUBLE_WORDS = ("database unavailable", "connection lost", "retrying with backoff")


def trouble(process: PgqctlProcess) -> list[str]:
    """The log lines of a worker that say it lost its database or failed unexpectedly."""
    lines = []
    for record in process.events():
        message = str(record.get("message", ""))
        if record.get("event") in TROUBLE_EVENTS or any(w in message for w in TROUBLE_WORDS):
            lines.append(message)
    return lines
