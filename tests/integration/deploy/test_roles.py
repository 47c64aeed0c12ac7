"""pgqctl run by least-privilege roles, as production databases grant them.

- The owner owns the queue's schema (a DBA made it for them) and runs
  `migrate`; it has no other privilege on the database.
- The application role has USAGE on the schema and SELECT, INSERT, UPDATE,
  DELETE on its tables, and nothing else: no TEMP on the database (revoked
  from PUBLIC, as hardened databases do) and no sequence privilege (the
  identity column of `jobs` needs none). It enqueues, runs workers and does
  the operator's chores.
- The monitoring role reads.

A role missing a privilege must be told which, and the GRANT that fixes it.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.support.servers import Roles, dbname_of, pgqctl, roles, statuses

__all__ = ["roles"]

SCHEMA = "q"


@dataclass
class Deployment:
    admin: str  # the test database, as superuser
    owner: str
    app: str
    monitor: str
    stranger: str  # may connect, nothing more
    unseated: str  # USAGE on the schema, no privilege on its tables
    roles: Roles

    def dsn(self, role: str) -> str:
        return self.roles.dsn(self.admin, role)

    def run(
        self, role: str, *args: str, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return pgqctl(*args, "--dsn", self.dsn(role), "--schema", SCHEMA, input=input)


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result


@pytest.fixture
def deployment(empty_dsn: str, roles: Roles) -> Iterator[Deployment]:
    made = Deployment(
        admin=empty_dsn,
        owner=roles.create("owner"),
        app=roles.create("app"),
        monitor=roles.create("monitor"),
        stranger=roles.create("stranger"),
        unseated=roles.create("unseated"),
        roles=roles,
    )
    database = sql.Identifier(dbname_of(empty_dsn))
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(
                sql.Identifier(SCHEMA), sql.Identifier(made.owner)
            )
        )
        conn.execute(sql.SQL("REVOKE TEMP ON DATABASE {} FROM PUBLIC").format(database))
    ok(made.run(made.owner, "migrate"))
    # The grants an owner gives, as the owner gives them.
    with psycopg.connect(made.dsn(made.owner), autocommit=True) as conn:
        schema = sql.Identifier(SCHEMA)
        for role in (made.app, made.monitor, made.unseated):
            conn.execute(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, sql.Identifier(role))
            )
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(
                schema, sql.Identifier(made.app)
            )
        )
        conn.execute(
            sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(
                schema, sql.Identifier(made.monitor)
            )
        )
    yield made


def enqueued(admin: str) -> list[tuple[int, str, str]]:
    """(id, kind, status) of every job, by id."""
    with psycopg.connect(admin, autocommit=True) as conn:
        return conn.execute(
            sql.SQL("SELECT id, kind, status FROM {}.jobs ORDER BY id").format(
                sql.Identifier(SCHEMA)
            )
        ).fetchall()


def printed_ids(result: subprocess.CompletedProcess[str]) -> list[int]:
    return [int(line) for line in result.stdout.split()]


def test_owner_migrates_its_own_schema(deployment: Deployment) -> None:
    # (The fixture ran the first `migrate` as the owner.)
    ok(deployment.run(deployment.owner, "migrate"))
    ok(deployment.run(deployment.owner, "migrate", "--check"))
    with psycopg.connect(deployment.admin, autocommit=True) as conn:
        owners = conn.execute(
            "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = %s", (SCHEMA,)
        ).fetchall()
    assert owners == [(deployment.owner,)]


def test_app_role_enqueues_one_job(deployment: Deployment) -> None:
    result = ok(deployment.run(deployment.app, "enqueue", "mail", '{"argv": ["true"]}'))
    assert [(i, k) for i, k, _ in enqueued(deployment.admin)] == [(int(result.stdout), "mail")]


@pytest.mark.parametrize("lines", [1, 500])
def test_app_role_enqueues_a_file_without_temp_privilege(
    deployment: Deployment, lines: int, tmp_path: Path
) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(f'{{"kind": "k{n}"}}\n' for n in range(lines)))
    result = ok(deployment.run(deployment.app, "enqueue", "--file", str(jobs)))
    ids = printed_ids(result)
    # In file order: the n-th id printed is the job of the n-th line.
    by_id = {i: k for i, k, _ in enqueued(deployment.admin)}
    assert [by_id.get(i) for i in ids] == [f"k{n}" for n in range(lines)]


def test_app_role_enqueues_from_stdin(deployment: Deployment) -> None:
    lines = "".join(f'{{"kind": "k{n}"}}\n' for n in range(300))
    result = ok(deployment.run(deployment.app, "enqueue", "--file", "-", input=lines))
    assert len(printed_ids(result)) == 300


def _insert(admin: str, values: str) -> None:
    """Rows put in place as the superuser, with plain SQL."""
    with psycopg.connect(admin) as conn:
        conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(SCHEMA)))
        conn.execute(
            "INSERT INTO jobs (kind, payload, status, attempts, max_attempts,"
            " locked_until, locked_by, finished_at) VALUES " + values
        )


def test_app_role_runs_a_worker(deployment: Deployment, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(
        '{"kind": "ok", "payload": {"argv": ["true"]}}\n'
        '{"kind": "bad", "payload": {"argv": ["false"]}, "max_attempts": 1}\n'
    )
    ok(deployment.run(deployment.app, "enqueue", "--file", str(jobs)))
    worker = ok(deployment.run(deployment.app, "worker", "--burst", "--concurrency", "2"))
    assert "error" not in worker.stderr.lower(), worker.stderr
    assert statuses(deployment.admin, SCHEMA) == {"done": 1, "failed": 1}


def test_app_role_reaps_requeues_and_purges(deployment: Deployment) -> None:
    _insert(
        deployment.admin,
        "('lost', '{}', 'running', 1, 3, now() - interval '1 minute', 'gone:1:0', NULL),"
        " ('broken', '{}', 'failed', 3, 3, NULL, NULL, now()),"
        " ('old', '{}', 'done', 1, 3, NULL, NULL, now() - interval '1 day')",
    )
    ok(deployment.run(deployment.app, "reap"))
    ok(deployment.run(deployment.app, "requeue", "--failed"))
    purged = ok(deployment.run(deployment.app, "purge", "--json"))
    assert json.loads(purged.stdout) == {"deleted": 1}
    assert [(k, s) for _, k, s in enqueued(deployment.admin)] == [
        ("lost", "pending"),
        ("broken", "pending"),
    ]


@pytest.mark.parametrize(
    "command",
    [
        ("stats",),
        ("stats", "--json"),
        ("leases",),
        ("list",),
        ("show",),
        ("migrate", "--status"),
        ("check", "--json"),
        ("metrics",),
    ],
    ids=" ".join,
)
def test_monitor_role_reads(deployment: Deployment, command: tuple[str, ...]) -> None:
    _insert(
        deployment.admin,
        "('seen', '{}', 'failed', 3, 3, NULL, NULL, now()),"
        " ('busy', '{}', 'running', 1, 3, now() + interval '5 minutes', 'w:1:0', NULL)",
    )
    if command == ("show",):
        command = ("show", str(enqueued(deployment.admin)[0][0]))
    result = ok(deployment.run(deployment.monitor, *command))
    assert result.stdout


# What a GRANT may be on: the schema, or the queue's tables one way or another.
ON_SCHEMA = rf"SCHEMA {SCHEMA}"
ON_TABLES = r"(TABLE |ALL TABLES IN SCHEMA )?[\w.]+"


def _grant_named(stderr: str, privilege: str, on: str, role: str) -> bool:
    """Whether the message gives a GRANT of `privilege` ON `on` TO `role` (quoted or not)."""
    text = stderr.replace('"', "")
    pattern = rf"GRANT [^`\n]*\b{privilege}\b[^`\n]* ON {on} TO {re.escape(role)}\b"
    return re.search(pattern, text, re.IGNORECASE) is not None


@pytest.mark.parametrize(
    "command", [("stats",), ("enqueue", "mail"), ("worker", "--burst")], ids=" ".join
)
def test_role_without_schema_usage_is_told_the_grant(
    deployment: Deployment, command: tuple[str, ...]
) -> None:
    result = deployment.run(deployment.stranger, *command)
    assert result.returncode == 1, result.stderr
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert "USAGE" in message, message
    assert _grant_named(message, "USAGE", ON_SCHEMA, deployment.stranger), message
    # The queue is there: migrating is not what would help.
    assert "pgqctl migrate" not in message


@pytest.mark.parametrize(
    ("who", "command", "privilege"),
    [
        ("unseated", ("stats",), "SELECT"),
        ("unseated", ("list",), "SELECT"),
        ("monitor", ("enqueue", "mail"), "INSERT"),
        ("monitor", ("reap",), "UPDATE"),
    ],
    ids=["stats", "list", "enqueue", "reap"],
)
def test_role_without_a_table_grant_is_told_the_grant(
    deployment: Deployment, who: str, command: tuple[str, ...], privilege: str
) -> None:
    if command == ("reap",):
        # Something to reap, so that reap must write.
        _insert(
            deployment.admin,
            "('lost', '{}', 'running', 1, 3, now() - interval '1 minute', 'gone:1:0', NULL)",
        )
    role = getattr(deployment, who)
    result = deployment.run(role, *command)
    assert result.returncode == 1, result.stderr
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert _grant_named(message, privilege, ON_TABLES, role), message
    assert "pgqctl migrate" not in message
