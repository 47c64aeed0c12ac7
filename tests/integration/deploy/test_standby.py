"""pgqctl pointed at a hot standby (a streaming replica), or at a primary that fails over.

A standby is a fine place to read the queue from (dashboards, `stats` in a
cron job) and no place to run it: every write fails there with "cannot
execute ... in a read-only transaction". Commands that write, and workers,
must say at once that the server is a standby and that they need the
primary, rather than retry for ever or print a raw error; reading commands
must just work.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
import pytest

from tests.support.processes import PgqctlProcess, start_pgqctl
from tests.support.servers import (
    Cluster,
    Servers,
    fresh_servers,
    pg_servers,
    pgqctl,
    wait_replayed,
    wait_until,
)

__all__ = ["fresh_servers", "pg_servers", "start_pgqctl"]

DB = "queue"
STANDBY = re.compile(r"standby.*primary|primary.*standby", re.IGNORECASE)


@dataclass
class Replicated:
    primary: Cluster
    replica: Cluster
    failed_id: int

    @property
    def replica_dsn(self) -> str:
        return self.replica.dsn(DB)


def migrated_primary(servers: Servers) -> Cluster:
    primary = servers.primary()
    with psycopg.connect(primary.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DB}")
    result = pgqctl("migrate", "--dsn", primary.dsn(DB))
    assert result.returncode == 0, result.stderr
    return primary


@pytest.fixture(scope="module")
def replicated(pg_servers: Servers) -> Replicated:
    """A primary with a queue in every state, and its streaming replica, caught up."""
    primary = migrated_primary(pg_servers)
    with psycopg.connect(primary.dsn(DB), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (kind, payload, status, attempts, max_attempts,"
            " locked_until, locked_by, finished_at) VALUES"
            " ('waiting', '{}', 'pending', 0, 3, NULL, NULL, NULL),"
            " ('lost', '{}', 'running', 1, 3, now() - interval '1 minute', 'gone:1:0', NULL),"
            " ('busy', '{}', 'running', 1, 3, now() + interval '1 hour', 'here:1:0', NULL),"
            " ('old', '{}', 'done', 1, 3, NULL, NULL, now() - interval '30 days')"
        )
        row = conn.execute(
            "INSERT INTO jobs (kind, payload, status, attempts, max_attempts, finished_at)"
            " VALUES ('broken', '{}', 'failed', 3, 3, now()) RETURNING id"
        ).fetchone()
    assert row is not None
    replica = pg_servers.replica(primary)
    wait_replayed(primary, replica)
    return Replicated(primary, replica, row[0])


def standby_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if STANDBY.search(line)]


def refused(result: subprocess.CompletedProcess[str]) -> None:
    """Exit 1 with one line saying the server is a standby and to use the primary."""
    assert result.returncode == 1, result.stderr
    assert len(standby_lines(result.stderr)) == 1, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args", [(), ("--burst",)], ids=["worker", "worker --burst"])
def test_worker_refuses_a_standby_at_once(replicated: Replicated, args: tuple[str, ...]) -> None:
    began = time.monotonic()
    try:
        result = pgqctl("worker", "--dsn", replicated.replica_dsn, *args, timeout=30)
    except subprocess.TimeoutExpired as exc:
        logged = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        pytest.fail(f"the worker still ran on a standby after 30s; its log began:\n{logged[:1500]}")
    elapsed = time.monotonic() - began
    refused(result)
    assert elapsed < 10, f"took {elapsed:.1f}s"


WRITES = [
    ("enqueue", "mail", '{"argv": ["true"]}'),
    ("enqueue", "--file", "-"),
    ("reap",),
    ("requeue", "--failed"),
    ("purge",),
    ("migrate",),
]


@pytest.mark.parametrize("command", WRITES, ids=" ".join)
def test_write_commands_refuse_a_standby(replicated: Replicated, command: tuple[str, ...]) -> None:
    lines = '{"kind": "a"}\n{"kind": "b"}\n' if "--file" in command else None
    refused(pgqctl(*command, "--dsn", replicated.replica_dsn, input=lines, timeout=60))


READS = [
    ("stats",),
    ("stats", "--json"),
    ("leases",),
    ("list",),
    ("show", "ID"),
    ("reap", "--dry-run"),
    ("migrate", "--status"),
    ("migrate", "--check"),
    ("check", "--max-pending", "1000000", "--json"),
    ("metrics",),
]


@pytest.mark.parametrize("command", READS, ids=" ".join)
def test_read_commands_work_on_a_standby(replicated: Replicated, command: tuple[str, ...]) -> None:
    command = tuple(str(replicated.failed_id) if arg == "ID" else arg for arg in command)
    result = pgqctl(*command, "--dsn", replicated.replica_dsn, timeout=60)
    assert result.returncode == 0, result.stderr
    if command != ("migrate", "--check"):  # which answers with its exit status alone
        assert result.stdout


@pytest.mark.slow
def test_worker_stops_when_its_primary_becomes_a_standby(
    fresh_servers: Servers, start_pgqctl: Callable[..., PgqctlProcess]
) -> None:
    # A failover as the worker sees it: the server at its address goes away
    # and comes back, on the same port with the same data, as a standby.
    primary = migrated_primary(fresh_servers)
    worker = start_pgqctl("worker", "--dsn", primary.dsn(DB), "--log-format", "json")
    wait_until(
        lambda: "worker_started" in worker.log or worker.proc.poll() is not None,
        20,
        "the worker to start",
    )
    assert worker.proc.poll() is None, worker.log
    primary.demote()
    code = worker.wait(timeout=30)
    assert code == 1, worker.log
    messages = "\n".join(str(record.get("message", "")) for record in worker.events())
    assert len(standby_lines(messages)) == 1, worker.log


def test_the_web_page_with_actions_allowed_stays_read_only_on_a_standby(
    replicated: Replicated,
) -> None:
    pytest.importorskip("starlette", reason="needs pgqctl[web]")
    pytest.importorskip("httpx2", reason="needs httpx2 (pgqctl[test])")
    from starlette.testclient import TestClient

    from pgqctl import db
    from pgqctl.web.app import Settings, make_app

    app = make_app(
        Settings("the replica", None, "", actions=True),
        lambda: db.open_queue(replicated.replica_dsn, schema="public"),
    )
    failed = replicated.failed_id
    with TestClient(app, base_url="http://localhost", follow_redirects=False) as web:
        page = web.get(f"/jobs/{failed}").text
        assert "read-only: the database is a standby, which takes no writes" in page
        assert "Retry" not in page
        refused = web.post(f"/jobs/{failed}/retry", data={"form_token": "x" * 43})
    assert refused.status_code == 403 and "standby" in refused.text
