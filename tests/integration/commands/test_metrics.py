"""`pgqctl metrics` against a real PostgreSQL: the Prometheus exposition, the
textfile, and --listen.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgqctl.jobs import FINISHED, STATUS_NAMES
from tests.conftest import ctrl_c_at_default, run_cli
from tests.support.jobrows import add_jobs, insert_jobs, mixed_queues, sh
from tests.support.processes import start_worker
from tests.support.servers import closed_port_dsn

__all__ = ["start_worker"]  # a fixture


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def _serve(dsn: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgqctl", "metrics", "--dsn", dsn, "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_at_default,
    )
    assert proc.stderr is not None
    ready, _, _ = select.select([proc.stderr], [], [], 30)
    assert ready, "the server said nothing"
    line = proc.stderr.readline()
    assert "serving metrics on http://" in line, line
    url = line.split("on ", 1)[1].split(";")[0]
    return proc, url


def _scrape(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_parse_and_equal_stats_exact(dsn: str, conn: psycopg.Connection[Any]) -> None:
    mixed_queues(conn)
    result = run_cli("metrics", "--exact", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    families = {f.name: f for f in text_string_to_metric_families(result.stdout)}
    # Gauges, and the last minute's run and wait times as gauge histograms
    # (written as histograms in the classic text format).
    assert {f.type for f in families.values()} == {"gauge", "histogram"}
    assert {n for n, f in families.items() if f.type == "histogram"} == {
        "pgqctl_attempt_run_seconds",
        "pgqctl_attempt_wait_seconds",
    }
    assert all(f.documentation for f in families.values())
    assert "# TYPE pgqctl_jobs gauge" in result.stdout
    got = samples(result.stdout)
    stats = json.loads(run_cli("stats", "--exact", "--json", "--dsn", dsn).stdout)
    for queue in stats["queues"]:
        name = queue["queue"]
        for status in STATUS_NAMES:
            key = (("queue", name), ("status", status))
            assert got[("pgqctl_jobs", key)] == queue[status], (name, status)
        assert got[("pgqctl_expired_leases", (("queue", name),))] == queue["expired_leases"]
        age = got[("pgqctl_oldest_pending_age_seconds", (("queue", name),))]
        assert age == pytest.approx(queue["oldest_pending_age_seconds"] or 0, abs=5)
    jobs = {k: v for k, v in got.items() if k[0] == "pgqctl_jobs"}
    assert len(jobs) == len(stats["queues"]) * len(STATUS_NAMES)
    # Without --exact, the same but for done jobs, the history, which are not read.
    cheap = samples(run_cli("metrics", "--dsn", dsn).stdout)
    done = {k for k in got if k[0] == "pgqctl_jobs" and ("status", "done") in k[1]}
    assert {k for k in cheap if k[0] == "pgqctl_jobs"} == set(jobs) - done
    assert all(cheap[k] == got[k] for k in set(jobs) - done)
    finished = {
        (dict(k[1])["queue"], dict(k[1])["outcome"]): v
        for k, v in got.items()
        if k[0] == "pgqctl_jobs_finished_last_minute"
    }
    expected = {(q, outcome): 0 for q in ("emails", "sms") for outcome in FINISHED}
    assert finished == {**expected, ("emails", "done"): 2, ("sms", "failed"): 1}


def test_metrics_show_paused_queues_even_without_jobs(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    mixed_queues(conn)
    for queue in ("sms", "idle"):
        paused = run_cli("pause", "--force", queue, "--reason", "provider down", "--dsn", dsn)
        assert paused.exit_code == 0
    got = samples(run_cli("metrics", "--dsn", dsn).stdout)
    paused = {dict(k[1])["queue"]: v for k, v in got.items() if k[0] == "pgqctl_queue_paused"}
    assert paused == {"emails": 0, "sms": 1, "idle": 1}
    assert run_cli("resume", "sms", "--dsn", dsn).exit_code == 0
    got = samples(run_cli("metrics", "--dsn", dsn).stdout)
    assert got[("pgqctl_queue_paused", (("queue", "sms"),))] == 0


def test_metrics_textfile_is_replaced_whole_and_kept_on_failure(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    mixed_queues(conn)
    path = tmp_path / "pgqctl.prom"
    first = run_cli("metrics", "--dsn", dsn, "--textfile", str(path))
    assert first.exit_code == 0, first.stderr
    assert first.stdout == ""
    whole = path.read_text()
    assert set(samples(whole)) == set(samples(run_cli("metrics", "--dsn", dsn).stdout))

    # A reader polling the file while it is rewritten again and again sees
    # every time a whole exposition, never a part of one.
    # Each distinct content read, and how many reads: a tight loop reads the
    # same whole file thousands of times, and parsing every copy afterwards
    # took minutes for nothing.
    seen: set[str] = set()
    reads = 0
    stop = threading.Event()

    def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            seen.add(path.read_text())
            reads += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for _ in range(10):
            assert run_cli("metrics", "--dsn", dsn, "--textfile", str(path)).exit_code == 0
    finally:
        stop.set()
        thread.join()
    assert reads > 10
    assert all(set(samples(s)) == set(samples(whole)) for s in seen)

    # A metrics run that cannot read the queue leaves the last file as it was,
    # and no temporary file behind.
    before = path.read_bytes()
    failed = run_cli("metrics", "--dsn", closed_port_dsn(), "--textfile", str(path))
    assert failed.exit_code == 1
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["pgqctl.prom"]
    # Nor one that cannot write where it was told.
    missing = run_cli("metrics", "--dsn", dsn, "--textfile", str(tmp_path / "no" / "x.prom"))
    assert missing.exit_code == 1
    assert (
        missing.stderr
        == f"pgqctl: error: cannot write {tmp_path}/no/x.prom: No such file or directory\n"
    )
    assert path.read_bytes() == before


def test_metrics_listen_answers_scrapes_until_sigterm(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    mixed_queues(conn)
    proc, url = _serve(dsn)
    try:
        status, body = _scrape(url)
        assert status == 200
        assert samples(body)[("pgqctl_jobs", (("queue", "emails"), ("status", "pending")))] == 4
        # Each scrape reads the queue afresh.
        add_jobs(conn, 3, queue="emails")
        status, body = _scrape(url)
        assert samples(body)[("pgqctl_jobs", (("queue", "emails"), ("status", "pending")))] == 7
        # The address taken: said at once, exit 1.
        taken = url.removeprefix("http://").removesuffix("/metrics")
        again = run_cli("metrics", "--dsn", dsn, "--listen", taken)
        assert again.exit_code == 1
        assert again.stderr.startswith(f"pgqctl: error: cannot listen on {taken}: ")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_metrics_listen_answers_503_when_the_database_is_down_and_keeps_serving() -> None:
    proc, url = _serve(closed_port_dsn())
    try:
        for _ in range(2):
            status, body = _scrape(url)
            assert status == 503
            assert body.startswith("cannot connect to ") and body.count("\n") == 1
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C stops it as cleanly
        assert proc.wait(timeout=30) == 0
    assert proc.stderr is not None
    rest = proc.stderr.read()
    assert "Traceback" not in rest and "scrape failed: cannot connect" in rest


def test_metrics_give_the_last_minutes_run_and_wait_times_and_outcomes(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any
) -> None:
    sleepers = insert_jobs(conn, [{"argv": ["sleep", "0.3"]}] * 2)
    insert_jobs(conn, [sh("exit 3")], kind="broken", max_attempts=1)
    # Due 40 s before the worker starts: far from the other's wait however
    # busy the machine.
    conn.execute(
        "UPDATE jobs SET run_at = now() - interval '40 seconds' WHERE id = %s", sleepers[:1]
    )
    assert start_worker(dsn, "--burst", "--concurrency", "3").finish() == 0

    result = run_cli("metrics", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    found = samples(result.stdout)

    def bucket(name: str, kind: str, le: str) -> float:
        labels = (("kind", kind), ("le", le), ("queue", "default"))
        return found[(f"pgqctl_attempt_{name}_seconds_bucket", labels)]

    # Two ran 0.3 s: none under 0.25 s, both under 30 s (a busy machine
    # stretches a run, never shortens it).
    assert bucket("run", "test", "0.25") == 0 and bucket("run", "test", "30.0") == 2
    assert bucket("run", "test", "+Inf") == 2
    gsum = found[("pgqctl_attempt_run_seconds_gsum", (("kind", "test"), ("queue", "default")))]
    assert 0.6 <= gsum < 60.0
    # One of them was due 40 seconds before the worker started.
    assert bucket("wait", "test", "30.0") == 1 and bucket("wait", "test", "300.0") == 2
    outcomes = {
        (dict(labels)["kind"], dict(labels)["outcome"]): value
        for (name, labels), value in found.items()
        if name == "pgqctl_attempts_last_minute"
    }
    assert outcomes == {("test", "done"): 2, ("broken", "failed"): 1}
