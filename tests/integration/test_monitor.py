"""check, metrics and the monitoring side of stats, against a real PostgreSQL."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgqctl.jobs import FINISHED, STATUS_NAMES
from pgqctl.sql import query
from tests.conftest import ctrl_c_at_default, run_cli
from tests.integration.jobrows import add_jobs, ago, expired

ROOT = Path(__file__).resolve().parents[2]


def closed_port_dsn() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def check(dsn: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    result = run_cli("check", "--dsn", dsn, *args, env=env)
    assert result.exit_code in (0, 3), result.stderr
    return result.exit_code, result.stdout.splitlines()


def busy_queue(conn: psycopg.Connection[Any], queue: str = "emails") -> None:
    """A queue that is working: a job due now, one running, one done a minute ago."""
    add_jobs(conn, 1, queue=queue)
    add_jobs(conn, 1, queue=queue, status="running", attempts=1, locked_until=ago("-5 minutes"))
    add_jobs(conn, 1, queue=queue, status="done", attempts=1, finished_at=ago("1 minute"))


# -- check ----------------------------------------------------------------------------


def test_check_says_nothing_and_exits_0_on_a_healthy_queue(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    busy_queue(conn)
    every = ["--max-pending-age", "5m", "--max-pending", "10", "--max-failed", "0"]
    every += ["--max-expired-leases", "0", "--max-running-age", "1h", "--stalled", "10m"]
    assert check(dsn) == (0, [])
    assert check(dsn, *every) == (0, [])


def test_check_prints_one_line_per_breach_and_exits_3(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3, queue="emails", run_at=ago("2 hours"), created_at=ago("2 hours"))
    add_jobs(conn, 1, queue="emails", status="done", attempts=1, finished_at=ago("1 minute"))
    add_jobs(conn, 2, queue="sms", status="failed", attempts=3)
    expired(conn, 1, queue="sms")
    add_jobs(
        conn,
        1,
        queue="sms",
        status="running",
        attempts=1,
        run_at=ago("3 hours"),
        locked_until=ago("-5 minutes"),
    )
    add_jobs(conn, 1, queue="quiet")  # due now: holds everything
    code, lines = check(
        dsn,
        *("--max-pending-age", "5m", "--max-pending", "2", "--max-failed", "0"),
        *("--max-expired-leases", "0", "--max-running-age", "1h", "--stalled", "10m"),
    )
    assert code == 3
    assert lines == [
        "CRITICAL emails: oldest pending job waited 2h (max 5m)",
        "CRITICAL emails: 3 pending jobs (max 2)",
        "CRITICAL sms: 2 failed jobs (max 0)",
        "CRITICAL sms: 1 expired lease (max 0)",
        "CRITICAL sms: oldest running job has run up to 3h (max 1h)",
    ]
    # Each threshold alone: its own lines only.
    assert check(dsn, "--max-pending", "2") == (3, ["CRITICAL emails: 3 pending jobs (max 2)"])
    assert check(dsn, "--max-pending", "3") == (0, [])  # above the threshold, not at it


def test_check_finds_a_stalled_queue_whose_jobs_wait_and_none_finishes(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    # The 32-hour stall: due jobs waiting, the queue depth looking normal.
    add_jobs(conn, 5, queue="emails", run_at=ago("32 hours"), created_at=ago("32 hours"))
    # Work elsewhere, and long ago here, proves nothing about this queue now.
    add_jobs(conn, 3, queue="sms", status="done", attempts=1, finished_at=ago("1 minute"))
    add_jobs(conn, 3, queue="emails", status="done", attempts=1, finished_at=ago("20 minutes"))
    stalled = [
        "CRITICAL emails: stalled: due jobs waited 1d08h and no job finished in 10m"
        " (stalled after 10m)"
    ]
    assert check(dsn) == (3, stalled)  # --stalled 10m is a default
    assert check(dsn, "--stalled", "10m") == (3, stalled)
    assert check(dsn, "--stalled", "15m")[0] == 3
    # A job of the queue finished within the window: it moves, slowly.
    add_jobs(conn, 1, queue="emails", status="failed", attempts=3, finished_at=ago("5 minutes"))
    assert check(dsn, "--stalled", "10m") == (0, [])
    assert check(dsn, "--stalled", "4m")[0] == 3


def test_check_applies_the_defaults_only_when_no_threshold_is_given(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    expired(conn, 2, queue="emails")
    add_jobs(conn, 1, queue="emails", status="failed", attempts=3)
    assert check(dsn) == (3, ["CRITICAL emails: 2 expired leases (max 0)"])
    # Given one, only that one applies.
    assert check(dsn, "--max-failed", "0") == (3, ["CRITICAL emails: 1 failed job (max 0)"])
    assert check(dsn, "--max-expired-leases", "2") == (0, [])
    # Thresholds may come from the environment (a cron line's settings)...
    env = {"PGQCTL_MAX_EXPIRED_LEASES": "5"}
    assert check(dsn, env=env) == (0, [])


def test_check_holds_each_queue_on_its_own_or_only_those_named(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3, queue="emails")
    add_jobs(conn, 3, queue="sms")
    add_jobs(conn, 1, queue="billing")
    code, lines = check(dsn, "--max-pending", "2")
    assert (code, lines) == (
        3,
        ["CRITICAL emails: 3 pending jobs (max 2)", "CRITICAL sms: 3 pending jobs (max 2)"],
    )
    assert check(dsn, "--max-pending", "2", "--queue", "sms") == (
        3,
        ["CRITICAL sms: 3 pending jobs (max 2)"],
    )
    assert check(dsn, "--max-pending", "2", "--queue", "billing") == (0, [])
    # ...but never which queues: a worker's PGQCTL_QUEUE does not narrow a check.
    assert check(dsn, "--max-pending", "2", env={"PGQCTL_QUEUE": "billing"})[0] == 3
    # A named queue with no jobs is still checked, its figures zero.
    result = run_cli("check", "--dsn", dsn, "--queue", "nothing", "--json")
    assert result.exit_code == 0, result.stderr
    (queue,) = json.loads(result.stdout)["queues"]
    assert queue["queue"] == "nothing"
    assert queue["figures"]["pending"]["value"] == 0
    assert queue["figures"]["expired_leases"] == {
        "value": 0,
        "threshold": 0,
        "option": "--max-expired-leases",
        "ok": True,
    }


def test_check_json_gives_every_figure_its_threshold_and_whether_it_holds(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    add_jobs(conn, 3, queue="emails", run_at=ago("2 hours"))
    add_jobs(conn, 1, queue="emails", status="done", attempts=1, finished_at=ago("1 minute"))
    result = run_cli(
        "check", "--dsn", dsn, "--json", "--max-pending-age", "5m", "--max-pending", "10"
    )
    assert result.exit_code == 3, result.stderr
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert data["thresholds"] == {"max_pending_age": 300.0, "max_pending": 10}
    assert data["breaches"] == ["CRITICAL emails: oldest pending job waited 2h (max 5m)"]
    (queue,) = data["queues"]
    figures = queue["figures"]
    assert queue["queue"] == "emails" and queue["ok"] is False
    assert set(figures) == {
        "oldest_pending_age_seconds",
        "pending",
        "failed",
        "expired_leases",
        "oldest_running_age_seconds",
        "stalled_seconds",
        "active_workers",
    }
    age = figures["oldest_pending_age_seconds"]
    assert 7200 <= age["value"] < 7300
    assert (age["threshold"], age["option"], age["ok"]) == (300.0, "--max-pending-age", False)
    assert figures["pending"] == {
        "value": 3,
        "threshold": 10,
        "option": "--max-pending",
        "ok": True,
    }
    # Figures with no threshold applied are measured, and hold.
    assert figures["failed"] == {
        "value": 0,
        "threshold": None,
        "option": "--max-failed",
        "ok": True,
    }
    # No worker registered: none serves it (a minimum breached only when given).
    assert figures["active_workers"] == {
        "value": 0,
        "threshold": None,
        "option": "--min-workers",
        "ok": True,
    }
    # Without --stalled the window's finished jobs are not read.
    assert figures["stalled_seconds"]["value"] is None and queue["finished_in_window"] is None
    healthy = run_cli("check", "--dsn", dsn, "--json", "--stalled", "10m")
    assert healthy.exit_code == 0
    data = json.loads(healthy.stdout)
    assert data["ok"] is True and data["breaches"] == []
    assert data["queues"][0]["finished_in_window"] == 1


def test_check_that_cannot_check_exits_1_and_never_says_ok(empty_dsn: str) -> None:
    for target in (closed_port_dsn(), empty_dsn):
        for fmt in ([], ["--json"]):
            result = run_cli("check", "--dsn", target, *fmt)
            assert result.exit_code == 1, result.stderr
            assert result.stdout == ""
            (line,) = result.stderr.splitlines()
            assert line.startswith("pgqctl: error: ")
    assert "pgqctl migrate" in run_cli("check", "--dsn", empty_dsn).stderr


def test_check_refuses_a_duration_without_a_unit(dsn: str) -> None:
    result = run_cli("check", "--dsn", dsn, "--stalled", "10")
    assert result.exit_code == 2
    assert "no unit" in result.stderr


def _scans(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if node["Node Type"].endswith("Scan"):
        yield node
    for child in node.get("Plans", []):
        yield from _scans(child)


def test_the_window_of_finished_jobs_is_read_through_the_index(
    conn: psycopg.Connection[Any],
) -> None:
    # A long history finished before the window: the plan reads the window's
    # range of jobs_finished_idx, never the history (as a scan would).
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload, status, attempts, finished_at) "
        "SELECT 'q', 'k', '{}', 'done', 1, now() - interval '30 days' + i * interval '1 s' "
        "FROM generate_series(1, 20000) AS i"
    )
    conn.execute("ANALYZE jobs")
    text = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("monitor_finished_since")
    for status in FINISHED:
        params = {"status": status, "window": "10 minutes"}
        ((plan,),) = conn.execute(text, params).fetchall()
        scans = list(_scans(plan[0]["Plan"]))
        assert [s.get("Index Name") for s in scans] == ["jobs_finished_idx"], scans
        # The range of the window only: a few pages, not the index's hundred.
        assert "status" in scans[0]["Index Cond"], scans
        assert scans[0]["Actual Rows"] == 0 and scans[0]["Shared Hit Blocks"] < 10, scans


# -- metrics --------------------------------------------------------------------------


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def mixed_queues(conn: psycopg.Connection[Any]) -> None:
    add_jobs(conn, 4, queue="emails", run_at=ago("1 hour"))
    add_jobs(conn, 2, queue="emails", status="done", attempts=1, finished_at=ago("10 seconds"))
    add_jobs(conn, 5, queue="emails", status="done", attempts=1, finished_at=ago("5 minutes"))
    add_jobs(conn, 1, queue="sms", status="failed", attempts=3, finished_at=ago("30 seconds"))
    add_jobs(conn, 2, queue="sms", status="failed", attempts=3, finished_at=ago("2 hours"))
    expired(conn, 2, queue="sms")
    add_jobs(conn, 1, queue="sms", status="running", attempts=1, locked_until=ago("-5 minutes"))


def test_metrics_parse_and_equal_stats_exact(dsn: str, conn: psycopg.Connection[Any]) -> None:
    mixed_queues(conn)
    result = run_cli("metrics", "--exact", "--dsn", dsn)
    assert result.exit_code == 0, result.stderr
    families = {f.name: f for f in text_string_to_metric_families(result.stdout)}
    assert {f.type for f in families.values()} == {"gauge"}
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


# -- stats --------------------------------------------------------------------------


def test_stats_metric_prints_one_integer(dsn: str, conn: psycopg.Connection[Any]) -> None:
    mixed_queues(conn)
    add_jobs(conn, 2, queue="sms")

    def metric(*args: str) -> str:
        result = run_cli("stats", "--dsn", dsn, "--metric", *args)
        assert result.exit_code == 0, result.stderr
        return result.stdout

    assert metric("pending", "--queue", "emails") == "4\n"
    assert metric("pending") == "6\n"
    assert metric("pending", "--queue", "emails", "--queue", "sms") == "6\n"
    assert metric("pending", "--queue", "nothing") == "0\n"
    assert metric("expired_leases") == "2\n"
    assert metric("failed", "--queue", "sms") == "3\n"
    assert 3600 <= int(metric("oldest_pending_age_seconds", "--queue", "emails")) < 3700
    assert metric("oldest_pending_age_seconds", "--queue", "nothing") == "0\n"
    alone = run_cli("stats", "--dsn", dsn, "--queue", "emails")
    assert alone.exit_code == 2 and "--metric" in alone.stderr


def test_the_keda_scaler_query_counts_what_stats_metric_prints(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    yaml = pytest.importorskip("yaml")
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/keda.yaml").read_text()) if d]
    kinds = {(d["apiVersion"], d["kind"]) for d in docs}
    assert kinds == {
        ("keda.sh/v1alpha1", "ScaledObject"),
        ("keda.sh/v1alpha1", "TriggerAuthentication"),
    }
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    worker = yaml.safe_load((ROOT / "deploy/kubernetes/worker.yaml").read_text())
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    mixed_queues(conn)
    add_jobs(conn, 3, queue="default")
    (count,) = conn.execute(trigger["metadata"]["query"]).fetchone() or (None,)
    printed = run_cli("stats", "--dsn", dsn, "--metric", "pending", "--queue", "default")
    assert f"{count}\n" == printed.stdout == "3\n"


def test_stats_watch_stamps_each_snapshot(dsn: str, conn: psycopg.Connection[Any]) -> None:
    add_jobs(conn, 3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgqctl", "stats", "--watch", "0.2", "--json", "--dsn", dsn],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_at_default,
    )
    assert proc.stdout is not None
    snapshots = []
    deadline = time.monotonic() + 60
    while len(snapshots) < 2 and time.monotonic() < deadline:
        if select.select([proc.stdout], [], [], 1)[0]:
            snapshots.append(json.loads(proc.stdout.readline()))
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    import datetime as dt

    stamps = [dt.datetime.fromisoformat(s["ts"]) for s in snapshots]
    assert stamps[0] < stamps[1] and stamps[1] - stamps[0] >= dt.timedelta(seconds=0.2)
    assert abs(dt.datetime.now(dt.timezone.utc) - stamps[1]) < dt.timedelta(minutes=1)
    # Without --watch the JSON shape is as it was.
    once = json.loads(run_cli("stats", "--json", "--dsn", dsn).stdout)
    assert "ts" not in once


def test_stats_ignores_a_stray_watch_variable(dsn: str) -> None:
    # A cron `stats` with PGQCTL_WATCH in its environment still ends.
    result = subprocess.run(
        [sys.executable, "-m", "pgqctl", "stats", "--json", "--dsn", dsn],
        env={**os.environ, "PGQCTL_WATCH": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1 and "ts" not in json.loads(result.stdout)
