"""Upgrading a live queue: the oldest supported release's producers and
workers keep running, as real processes, while this pgqctl migrates."""

from __future__ import annotations

import itertools
import json
import os
import queue
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgqctl.sql import migrations
from tests.conftest import run_cli
from tests.support.processes import PgqctlProcess
from tests.support.servers import REPO_ROOT

# The oldest release whose schema `migrate` upgrades (one migration, 0001).
OLDEST_RELEASE = "5414984"


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """That release's code, from this repository's history, in a directory
    of its own (it runs on the current venv's dependencies)."""
    where = tmp_path_factory.mktemp("release")
    archive = where / "release.tar"
    made = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "archive", "-o", str(archive), OLDEST_RELEASE],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(
            f"release {OLDEST_RELEASE} is not in this clone's history (a shallow clone?): "
            f"`git fetch --unshallow` to run this test ({made.stderr.strip()})"
        )
    with tarfile.open(archive) as tar:
        tar.extractall(where, filter="data")
    return where


def old_pgqctl(release: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgqctl", *args],
        env=old_env(release),
        cwd=release,
        capture_output=True,
        text=True,
        timeout=60,
    )


def old_env(release: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGQCTL_")}
    return {**env, "PYTHONPATH": str(release)}


class Producer:
    """Runs the old `pgqctl enqueue` in a loop, one process after another,
    keeping what each call returned."""

    def __init__(self, release: Path, dsn: str, payload: str) -> None:
        self.calls: list[subprocess.CompletedProcess[str]] = []
        # When each call began and ended (monotonic clock).
        self.spans: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.args = ("enqueue", "upgrade", payload, "--dsn", dsn)
        self.release = release
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        while not self.stop.is_set():
            began = time.monotonic()
            self.calls.append(old_pgqctl(self.release, *self.args))
            self.spans.append((began, time.monotonic()))

    def inside(self, began: float, ended: float) -> int:
        """How many calls began and ended between `began` and `ended`."""
        return sum(1 for b, e in self.spans if began <= b and e <= ended)

    def wait_for_calls(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.calls) < count:
            assert time.monotonic() < deadline, "the producer stalled"
            time.sleep(0.05)


# The release's Python API in a loop, each job in a transaction of its own:
# one line per call, "<wall clock> <job id>" or "<wall clock> error <why>".
API_PRODUCER = """
import json, sys, time
from pgqctl import db
from pgqctl.enqueue import enqueue
conn = db.connect(sys.argv[1], schema="public")
payload = json.loads(sys.argv[2])
while True:
    try:
        with conn.transaction():
            job_id = enqueue(conn, "upgrade", payload)
        print(time.time(), job_id, flush=True)
    except Exception as exc:
        print(time.time(), "error", str(exc).replace(chr(10), " "), flush=True)
        time.sleep(0.05)
    time.sleep(0.005)
"""


def api_enqueues(lines: str) -> tuple[list[tuple[float, int]], list[str]]:
    """The API producer's enqueues (wall clock, job id), and its errors."""
    done, errors = [], []
    for line in lines.splitlines():
        when, _, rest = line.partition(" ")
        if rest.startswith("error"):
            errors.append(rest)
        elif rest:
            done.append((float(when), int(rest)))
    return done, errors


def longest_gap(times: list[float]) -> float:
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


@pytest.fixture
def producer(old_release: Path, empty_dsn: str, tmp_path: Path) -> Iterator[Producer]:
    ran = tmp_path / "ran"
    payload = json.dumps({"argv": ["sh", "-c", f'echo "$PGQCTL_JOB_ID" >> {ran}']})
    p = Producer(old_release, empty_dsn, payload)
    yield p
    p.stop.set()
    if p.thread.is_alive():
        p.thread.join()


@pytest.mark.slow
def test_old_producers_and_workers_keep_working_through_an_upgrade(
    old_release: Path, empty_dsn: str, producer: Producer, tmp_path: Path
) -> None:
    assert old_pgqctl(old_release, "migrate", "--dsn", empty_dsn).returncode == 0
    payload = producer.args[2]
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        # A history to read whole, and a backlog that the old worker runs
        # before, while and after the schema changes.
        c.execute(
            "INSERT INTO jobs (kind, payload, status, attempts, finished_at) "
            "SELECT 'history', '{}', 'done', 1, now() FROM generate_series(1, 200000)"
        )
        c.execute(
            "INSERT INTO jobs (kind, payload) SELECT 'upgrade', %s FROM generate_series(1, 300)",
            (payload,),
        )
    worker = PgqctlProcess(
        ["worker", "--dsn", empty_dsn, "--concurrency", "2"],
        tmp_path / "old-worker.log",
        env=old_env(old_release),
        cwd=old_release,
    )
    api_log = tmp_path / "api-producer.log"
    with api_log.open("w") as out:
        api = subprocess.Popen(
            [sys.executable, "-c", API_PRODUCER, empty_dsn, payload],
            env=old_env(old_release),
            cwd=old_release,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        producer.thread.start()
        producer.wait_for_calls(2)
        time.sleep(1.0)  # the API producer's pace before the upgrade
        began, began_wall = time.monotonic(), time.time()
        migrated = run_cli("migrate", "--dsn", empty_dsn)
        ended, ended_wall = time.monotonic(), time.time()
        assert migrated.exit_code == 0, migrated.stderr
        during = len(producer.calls)
        producer.wait_for_calls(during + 3)
        time.sleep(0.5)
        api.terminate()
        api.wait(10)
        producer.stop.set()
        producer.thread.join()
        wait_until_run(empty_dsn)
    finally:
        if api.poll() is None:
            api.kill()
        code = worker.stop(30)
    worker_log = worker.log

    # The release's API enqueued while the schema changed under it, and no
    # migration step held it off longer than a moment (its lock waits give
    # way to writers after --lock-wait, 500ms).
    api_done, api_errors = api_enqueues(api_log.read_text())
    assert api_errors == []
    before = [t for t, _ in api_done if t < began_wall]
    inside = [t for t, _ in api_done if began_wall <= t <= ended_wall]
    gap = longest_gap([began_wall, *inside, ended_wall])
    print(
        f"migrate took {ended - began:.1f}s; the old API enqueued {len(inside)} jobs inside it, "
        f"at most {gap:.2f}s apart (before it: {longest_gap(before):.2f}s); "
        f"{producer.inside(began, ended)} old `pgqctl enqueue` ran inside it"
    )
    assert len(inside) >= 10
    assert gap < max(2.0, 4 * longest_gap(before))

    failed = [(c.returncode, c.stderr.strip()) for c in producer.calls if c.returncode != 0]
    assert failed == []
    # A release-era command started after the upgrade works too.
    assert old_pgqctl(old_release, "stats", "--dsn", empty_dsn).returncode == 0
    assert code == 0, worker_log
    enqueued = {int(c.stdout) for c in producer.calls} | {i for _, i in api_done}
    with psycopg.connect(empty_dsn) as c:
        rows = c.execute("SELECT id, status, attempts FROM jobs WHERE kind = 'upgrade'")
        jobs = {id_: (status, attempts) for id_, status, attempts in rows}
    assert enqueued <= set(jobs)
    assert set(jobs.values()) == {("done", 1)}
    ran = [int(line) for line in (tmp_path / "ran").read_text().split()]
    assert sorted(ran) == sorted(jobs)  # each job ran, once
    # And this pgqctl uses the upgraded schema.
    assert run_cli("stats", "--dsn", empty_dsn).exit_code == 0


def wait_until_run(dsn: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as c:
        while c.execute(
            "SELECT count(*) FROM jobs WHERE kind = 'upgrade' AND status <> 'done'"
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, "the old worker did not run every job"
            time.sleep(0.1)


def test_a_schema_an_earlier_pgqctl_migrated_with_the_earlier_texts_reads_as_applied(
    empty_dsn: str,
) -> None:
    """As the release before the migration log left it: every migration in
    pgqctl_migrations, with the checksums of the files before they were cut
    into steps."""
    from pgqctl.migrate import EARLIER_CHECKSUMS
    from pgqctl.sql import migrations

    assert run_cli("migrate", "--dsn", empty_dsn).exit_code == 0
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute("DROP TABLE pgqctl_migration_log")
        c.execute("DELETE FROM pgqctl_migrations")
        for name, checksum in EARLIER_CHECKSUMS.items():
            c.execute(
                "INSERT INTO pgqctl_migrations (name, checksum) VALUES (%s, %s)", (name, checksum)
            )
    status = run_cli("migrate", "--status", "--json", "--dsn", empty_dsn)
    # The migrations that came after that release are pending, as for any upgrade.
    newer = len(migrations()) - len(EARLIER_CHECKSUMS)
    assert [r["status"] for r in json.loads(status.stdout)] == (
        ["applied"] * len(EARLIER_CHECKSUMS) + ["pending"] * newer
    )
    again = run_cli("migrate", "--dsn", empty_dsn)
    assert again.exit_code == 0, again.stderr
    assert run_cli("stats", "--dsn", empty_dsn).exit_code == 0


@pytest.fixture
def oldest_schema(old_release: Path, empty_dsn: str) -> str:
    """A database the oldest release migrated, with 30,000 finished jobs."""
    assert old_pgqctl(old_release, "migrate", "--dsn", empty_dsn).returncode == 0
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        c.execute(
            "INSERT INTO jobs (kind, payload, status, attempts, finished_at) "
            "SELECT 'history', '{}', 'done', 1, now() FROM generate_series(1, 30000)"
        )
        c.execute("ANALYZE jobs")
    return empty_dsn


def test_dry_run_and_status_say_what_each_pending_migration_locks_and_reads(
    oldest_schema: str,
) -> None:
    dry = run_cli("migrate", "--dry-run", "--json", "--dsn", oldest_schema)
    assert dry.exit_code == 0, dry.stderr
    planned = {r["name"]: r for r in json.loads(dry.stdout)}
    assert list(planned) == [m.name for m in migrations()[1:]]
    cancelled = planned["0004_cancelled.sql"]
    assert cancelled["locks"] == "jobs ACCESS EXCLUSIVE, jobs SHARE UPDATE EXCLUSIVE"
    assert cancelled["writers"] == "wait a moment"
    assert cancelled["reads"].endswith("~30,000 rows")
    assert cancelled["estimate"].startswith("~")
    assert planned["0005_paused_queues.sql"] == {
        "name": "0005_paused_queues.sql",
        "locks": "none (new objects only)",
        "writers": "go on",
        "reads": "",
        "estimate": "a moment",
    }
    assert planned["0002_claim_by_queue_and_kind.sql"]["writers"] == "go on"
    status = run_cli("migrate", "--status", "--json", "--dsn", oldest_schema)
    rows = {r["name"]: r for r in json.loads(status.stdout)}
    assert rows["0001_create_jobs.sql"]["status"] == "applied"
    assert rows["0001_create_jobs.sql"]["locks"] is None
    assert rows["0004_cancelled.sql"]["locks"] == cancelled["locks"]


def test_a_migration_waiting_for_a_lock_lets_writers_through(oldest_schema: str) -> None:
    """The classic outage: an ALTER TABLE waits behind a long transaction and
    every writer queues behind the ALTER. Here migrate gives way and retries."""
    with psycopg.connect(oldest_schema) as holder, psycopg.connect(oldest_schema) as writer:
        holder.execute("SELECT 1 FROM jobs LIMIT 1")  # a reader's open transaction
        migrate = subprocess.Popen(
            [sys.executable, "-m", "pgqctl", "migrate", "--dsn", oldest_schema],
            stderr=subprocess.PIPE,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(s) for s in migrate.stderr or ()])
        reader.start()
        try:
            said = ""
            while "trying again" not in said:
                try:
                    said = lines.get(timeout=30)
                except queue.Empty:
                    pytest.fail("migrate waits for its lock and does not let writers by")
            # Would wait for the holder's transaction behind the queued ALTER:
            # fails after 10 s instead (the holder stays open until after it).
            writer.execute("SET lock_timeout = '10s'")
            writer.execute("INSERT INTO jobs (kind, payload) VALUES ('during', '{}')")
            writer.commit()
        finally:
            holder.rollback()
            migrate.wait(timeout=60)
            reader.join()
    rest = "".join(lines.queue)
    assert migrate.returncode == 0, rest
    assert "applied 0009_jobs_autovacuum.sql" in rest


def test_clients_older_than_the_schema_work_until_a_breaking_migration(
    old_release: Path, empty_dsn: str
) -> None:
    """The compatibility rule (docs/operating.md: Which pgqctl can use which
    schema), with migrations newer than every client: first an additive one, then a
    breaking one, recorded as `migrate` records them."""
    from pgqctl import migrate
    from pgqctl.sql import Migration

    assert old_pgqctl(old_release, "migrate", "--dsn", empty_dsn).returncode == 0
    assert run_cli("migrate", "--dsn", empty_dsn).exit_code == 0

    def apply_newer(number: int, compatibility: str) -> None:
        newer = Migration(number, f"{number:04d}_newer.sql", f"-- compatibility: {compatibility}\n")
        with psycopg.connect(empty_dsn, autocommit=True) as c, c.transaction():
            migrate._record(c, newer)

    apply_newer(90, "additive")
    assert run_cli("stats", "--dsn", empty_dsn).exit_code == 0
    assert old_pgqctl(old_release, "stats", "--dsn", empty_dsn).returncode == 0

    apply_newer(91, "breaking")
    new, old = (
        run_cli("stats", "--dsn", empty_dsn),
        old_pgqctl(old_release, "stats", "--dsn", empty_dsn),
    )
    assert (new.exit_code, new.stderr) == (
        1,
        "pgqctl: error: schema public was migrated by a newer pgqctl whose migration "
        "0091_newer.sql changes what older ones rely on: upgrade pgqctl to use it\n",
    )
    assert (old.returncode, old.stderr) == (
        1,
        "pgqctl: error: schema public was migrated by a newer pgqctl: upgrade pgqctl to use it\n",
    )
