"""`pgqctl doctor`: whatever keeps the queue's dead tuples from vacuum, named
with the SQL to act, and a queue that needs nothing said healthy.

The horizon tests run on a server of their own (initdb), with autovacuum on
as a production server has it (the suite's server runs without), prepared
transactions allowed and wal_level logical; the rest on the suite's server.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqctl import doctor
from tests.support.processes import start_pgqctl
from tests.support.servers import (
    Cluster,
    Roles,
    Servers,
    dbname_of,
    pg_servers,
    pgqctl,
    roles,
    unique,
    wait_until,
)

__all__ = ["pg_servers", "roles", "start_pgqctl"]


SETTINGS = {"max_prepared_transactions": "4", "wal_level": "logical"}


@pytest.fixture(scope="module")
def server(pg_servers: Servers) -> Cluster:
    return pg_servers.primary("doctor", settings=SETTINGS)


@contextlib.contextmanager
def migrated_database(cluster: Cluster) -> Iterator[str]:
    name = unique("doctor")
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = cluster.dsn(name)
    try:
        migrated = pgqctl("migrate", "--dsn", dsn)
        assert migrated.returncode == 0, migrated.stderr
        yield dsn
    finally:
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.fixture
def queue(server: Cluster) -> Iterator[str]:
    with migrated_database(server) as dsn:
        yield dsn


def run_doctor(dsn: str, *args: str) -> tuple[int, str, str]:
    result = pgqctl("doctor", "--dsn", dsn, *args)
    return result.returncode, result.stdout, result.stderr


def doctor_json(dsn: str, *args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run_doctor(dsn, "--json", *args)
    assert code in (0, 3), err
    return code, json.loads(out)


def churn_in_sql(dsn: str, jobs: int) -> None:
    """Jobs inserted, claimed and done the way a worker moves them: two dead
    row versions each."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (kind, payload) SELECT 'churn', '{\"argv\": [\"true\"]}'"
            " FROM generate_series(1, %s)",
            (jobs,),
        )
        conn.execute(
            "UPDATE jobs SET status = 'running', attempts = attempts + 1,"
            " locked_until = now() + interval '1 minute', locked_by = 'test:1:0'"
            " WHERE status = 'pending'"
        )
        conn.execute(
            "UPDATE jobs SET status = 'done', locked_until = NULL, finished_at = now()"
            " WHERE status = 'running'"
        )
        # Counted in the statistics now, not when this backend gets round to it.
        conn.execute("SELECT pg_stat_force_next_flush()")


def vacuum(dsn: str) -> None:
    """Vacuum every table of the queue (a worker's stop leaves a dead row in
    `workers`, say), as an operator following doctor's advice would."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM")


def dead_tuples(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'jobs'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def sessions(dsn: str) -> list[int]:
    """The pids of the other sessions of the database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend' ORDER BY pid"
        ).fetchall()
    return [pid for (pid,) in rows]


def findings(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["kind"] == kind]


def test_a_fresh_queue_is_healthy(queue: str) -> None:
    code, out, err = run_doctor(queue)
    assert code == 0, out + err
    assert "ok: nothing needs doing" in err
    assert out.startswith("horizon:\n  nothing holds it back\n")
    assert "\njobs: 0 live, 0 dead tuples" in out
    for table in ("paused_queues", "pgqctl_migrations"):
        assert f"\n{table}: " in out
    assert "nothing holds it back" in out


@pytest.mark.slow
def test_an_idle_transaction_holding_an_xid_is_named_while_a_worker_churns(
    queue: str, tmp_path: Path, start_pgqctl: Any
) -> None:
    holder = psycopg.connect(queue, application_name="report-builder")
    try:
        (xid,) = holder.execute("SELECT txid_current()").fetchone() or (None,)
        assert xid is not None
        pid = holder.info.backend_pid
        began = time.monotonic()
        # 20,000 jobs through a real worker while the transaction sits idle.
        lines = [{"kind": "noop", "payload": {"argv": ["true"]}}] * 20_000
        jobs_file = tmp_path / "jobs.jsonl"
        jobs_file.write_text("".join(json.dumps(line) + "\n" for line in lines))
        enqueued = pgqctl("enqueue", "--file", str(jobs_file), "--dsn", queue)
        assert enqueued.returncode == 0, enqueued.stderr
        # The churn is what is tested here, not the attempt history.
        worker = start_pgqctl(
            "worker", "--burst", "--concurrency", "4", "--no-history", "--dsn", queue
        )
        assert worker.wait(300) == 0, worker.log[-2000:]
        # Its sessions gone, their statistics are counted.
        wait_until(lambda: sessions(queue) == [pid], 10, "the worker's sessions to end")
        vacuum(queue)  # it can remove none of them: the transaction may still see them
        kept = dead_tuples(queue)
        assert kept >= 2 * 20_000  # each job: one row version at its claim, one at its end
        time.sleep(max(0.0, 10.5 - (time.monotonic() - began)))

        code, out, err = run_doctor(queue, "--max-horizon-age", "10s")
        assert code == 3, out + err
        assert f"SELECT pg_terminate_backend({pid});" in out
        (line,) = [x for x in out.splitlines() if x.startswith("FINDING horizon_transaction")]
        assert f"pid {pid} (" in line and "application 'report-builder'" in line
        assert "idle in transaction" in line
        said = re.search(r"keeps ([0-9,]+) dead tuples", line)
        assert said and int(said.group(1).replace(",", "")) >= 2 * 20_000

        code, report = doctor_json(queue, "--max-horizon-age", "10s")
        assert code == 3
        (found,) = findings(report, "horizon_transaction")
        figures = found["figures"]
        assert figures["pid"] == pid and figures["application"] == "report-builder"
        assert figures["age_seconds"] > 10 and figures["xid"] == str(xid)
        # (An autoanalyze may since have estimated the count afresh.)
        assert figures["dead_tuples_kept"] >= 2 * 20_000
        assert figures["dead_tuples_kept_is"] == "counted"
        assert found["sql"] == [f"SELECT pg_terminate_backend({pid});"]
        # The holder is the cause: no advice to vacuum, which could not help.
        assert not findings(report, "vacuum_overdue")
    finally:
        holder.close()
    # Its backend ends a moment after the client leaves; until then it still
    # holds the horizon, and the vacuum below could remove nothing.
    wait_until(lambda: pid not in sessions(queue), 10, "the holder's session to end")
    vacuum(queue)
    code, out, err = run_doctor(queue, "--max-horizon-age", "10s")
    assert code == 0, out + err
    assert "\njobs: 20,000 live, 0 dead tuples" in out


@pytest.fixture
def prepared(server: Cluster, queue: str) -> Iterator[str]:
    gid = unique("pgqctl-doctor")
    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT txid_current()")
        conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
    try:
        yield gid
    finally:
        with psycopg.connect(queue, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", (gid,)).fetchone():
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


def test_a_prepared_transaction_is_named_with_its_rollback(queue: str, prepared: str) -> None:
    churn_in_sql(queue, 2000)
    vacuum(queue)
    time.sleep(1.2)
    code, report = doctor_json(queue, "--max-horizon-age", "1s")
    assert code == 3
    (found,) = findings(report, "horizon_prepared")
    assert found["figures"]["gid"] == prepared
    assert found["figures"]["dead_tuples_kept"] == dead_tuples(queue) >= 4000
    statement = f"ROLLBACK PREPARED '{prepared}';"
    assert found["sql"] == [statement]
    code, out, _ = run_doctor(queue, "--max-horizon-age", "1s")
    assert code == 3 and f"  {statement}" in out

    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute(statement)  # as printed
    vacuum(queue)
    code, out, err = run_doctor(queue, "--max-horizon-age", "1s")
    assert code == 0, out + err


def test_a_young_holder_is_no_finding(queue: str) -> None:
    with psycopg.connect(queue) as holder:
        holder.execute("SELECT txid_current()")
        churn_in_sql(queue, 100)
        code, report = doctor_json(queue)  # --max-horizon-age 5m
        assert code == 0, report["findings"]
        (held,) = [h for h in report["horizon"]["holders"] if h["kind"] == "transaction"]
        assert held["pid"] == holder.info.backend_pid
        assert held["dead_tuples_kept"] == dead_tuples(queue) > 0


def test_an_abandoned_logical_slot_is_named_with_its_drop(queue: str) -> None:
    slot = unique("pgqctl_doctor")
    with psycopg.connect(queue, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    try:
        code, report = doctor_json(queue)
        assert code == 3
        (found,) = findings(report, "horizon_slot")
        # A logical slot holds back the catalogs (catalog_xmin), not jobs.
        assert found["figures"]["catalog_xmin"] is not None and found["figures"]["xmin"] is None
        assert found["figures"]["holds_queue_tables"] is False
        assert found["sql"] == [f"SELECT pg_drop_replication_slot('{slot}');"]
        with psycopg.connect(queue, autocommit=True) as conn:
            conn.execute(found["sql"][0])
        code, _, err = run_doctor(queue)
        assert code == 0, err
    finally:
        with psycopg.connect(queue, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (slot,),
            )


def test_a_standby_slot_left_holding_xmin_is_named(
    pg_servers: Servers, server: Cluster, queue: str
) -> None:
    """A standby with hot_standby_feedback sends its oldest snapshot to its
    slot, which keeps it after the standby goes away."""
    slot = unique("standby")
    standby = pg_servers.replica(
        server, unique("replica"), settings={**SETTINGS, "hot_standby_feedback": "on"}, slot=slot
    )
    try:
        reader = psycopg.connect(standby.dsn(dbname_of(queue)))
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM jobs")

        def slot_xmin() -> Any:
            with psycopg.connect(queue, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT xmin FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()
            return row and row[0]

        wait_until(slot_xmin, 30, "the standby's feedback to reach its slot")
        churn_in_sql(queue, 1000)
        standby.stop()  # the standby goes; its slot stays, with the xmin it had
        reader.close()
        vacuum(queue)
        code, report = doctor_json(queue)
        assert code == 3
        (found,) = findings(report, "horizon_slot")
        assert found["figures"]["slot_name"] == slot and found["figures"]["active"] is False
        assert found["figures"]["dead_tuples_kept"] == dead_tuples(queue) >= 2000
        assert found["figures"]["dead_tuples_kept_is"] == "at most"
        assert found["sql"] == [f"SELECT pg_drop_replication_slot('{slot}');"]
        with psycopg.connect(queue, autocommit=True) as conn:
            conn.execute(found["sql"][0])
        vacuum(queue)
        code, _, err = run_doctor(queue)
        assert code == 0, err
    finally:
        with contextlib.suppress(Exception):
            standby.stop()
        with psycopg.connect(queue, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                " WHERE slot_name = %s",
                (slot,),
            )


# --- autovacuum ---------------------------------------------------------------------


def test_migrate_gives_jobs_the_settings_doctor_recommends(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'jobs'::regclass"
        ).fetchone()
    assert row is not None
    assert dict(o.split("=", 1) for o in row[0]) == doctor.RECOMMENDED


def test_settings_changed_away_are_found_and_the_printed_sql_restores_them(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "ALTER TABLE jobs RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold)"
        )
        conn.execute("ALTER TABLE jobs SET (autovacuum_analyze_threshold = 1000000)")
    _, report = doctor_json(dsn)
    (found,) = findings(report, "autovacuum_settings")
    assert "autovacuum_vacuum_scale_factor not set" in found["summary"]
    assert "autovacuum_analyze_threshold=1000000" in found["summary"]
    (statement,) = found["sql"]
    assert statement.startswith('ALTER TABLE "public"."jobs" SET (')
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)
    _, report = doctor_json(dsn)
    assert not findings(report, "autovacuum_settings")


def test_jobs_left_unvacuumed_while_it_churns_is_found(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        # Whether the server runs autovacuum or not (said so when it does not),
        # it must not get to jobs during the test: as when it is busy elsewhere.
        conn.execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
        (server_autovacuum,) = conn.execute("SELECT current_setting('autovacuum')").fetchone() or ()
    churn_in_sql(dsn, 3000)
    code, report = doctor_json(dsn)
    assert code == 3
    assert bool(findings(report, "autovacuum_off")) == (server_autovacuum == "off")
    (found,) = findings(report, "vacuum_overdue")
    assert found["figures"]["n_dead_tup"] == dead_tuples(dsn) >= 6000
    assert found["sql"] == ['VACUUM (VERBOSE) "public"."jobs";']
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(found["sql"][0])
    _, report = doctor_json(dsn)
    assert not findings(report, "vacuum_overdue")


# --- what a monitoring role sees ----------------------------------------------------------


def grant_reader(dsn: str, role: str, *, monitor: bool) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        ident = sql.Identifier(role)
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(ident))
        conn.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(ident))
        if monitor:
            conn.execute(sql.SQL("GRANT pg_monitor TO {}").format(ident))


def test_a_pg_monitor_member_sees_another_roles_holder(dsn: str, roles: Roles) -> None:
    role = roles.create("doctor")
    grant_reader(dsn, role, monitor=True)
    with psycopg.connect(dsn, application_name="etl") as holder:
        holder.execute("SELECT txid_current()")
        churn_in_sql(dsn, 100)
        time.sleep(1.2)
        code, out, err = run_doctor(roles.dsn(dsn, role), "--max-horizon-age", "1s")
        assert code == 3, err
        pid = holder.info.backend_pid
        assert f"SELECT pg_terminate_backend({pid});" in out
        assert "application 'etl'" in out
        assert "could not see the transactions" not in err


def test_a_role_without_pg_monitor_says_what_it_could_not_see(dsn: str, roles: Roles) -> None:
    role = roles.create("doctor")
    grant_reader(dsn, role, monitor=False)
    with psycopg.connect(dsn, application_name="etl") as holder:
        holder.execute("SELECT txid_current()")
        churn_in_sql(dsn, 100)
        time.sleep(1.2)
        code, out, err = run_doctor(roles.dsn(dsn, role), "--max-horizon-age", "1s")
        assert code in (0, 3), err  # 3 only for what it could see (autovacuum off, say)
        assert "could not see the transactions of other roles' sessions (1 in this database)" in err
        assert "GRANT pg_monitor TO" in err
        # Its xid shows, not how long it has been open: named, not judged.
        pid = holder.info.backend_pid
        assert f"  pid {pid} (user postgres, application 'etl', state not seen" in out
        assert "pg_terminate_backend" not in out
        code, report = doctor_json(roles.dsn(dsn, role), "--max-horizon-age", "1s")
        assert report["unseen"] and not findings(report, "horizon_transaction")
        assert code == (3 if report["findings"] else 0)


def test_a_queue_it_cannot_reach_is_exit_1() -> None:
    code, out, err = run_doctor("postgresql://nobody@127.0.0.1:1/none")
    assert code == 1 and out == "" and "cannot connect" in err


def test_a_queue_in_another_schema_is_examined_there(empty_dsn: str) -> None:
    assert pgqctl("migrate", "--schema", "staging", "--dsn", empty_dsn).returncode == 0
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE staging.jobs RESET (autovacuum_vacuum_threshold)")
        made = conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = 'staging'::regnamespace"
            " AND relkind IN ('r', 'p') AND NOT relispartition AND relname <> 'jobs'"
            " ORDER BY relname"
        ).fetchall()
    _, report = doctor_json(empty_dsn, "--schema", "staging")
    # Every table migrate made there, jobs first: none of another schema's.
    assert [t["table"] for t in report["tables"]] == ["jobs", *(name for (name,) in made)]
    assert {"workers", "schedules", "pgqctl_migrations"} <= {name for (name,) in made}
    (found,) = findings(report, "autovacuum_settings")
    assert found["sql"][0].startswith('ALTER TABLE "staging"."jobs" SET (')


def test_churn_that_outruns_autovacuum_is_found(dsn: str) -> None:
    vacuum(dsn)
    churn_in_sql(dsn, 2000)  # 6,000 rows changed within about a second of the vacuum
    _, report = doctor_json(dsn)
    (found,) = findings(report, "autovacuum_churn")
    # More than ten thresholds' worth of rows between two visits of autovacuum.
    figures = found["figures"]
    between = figures["rows_per_second"] * figures["naptime_seconds"]
    assert between > 10 * figures["vacuum_threshold"]
    assert "ALTER SYSTEM SET autovacuum_naptime = '15s';" in found["sql"]
    assert not findings(report, "vacuum_overdue")
