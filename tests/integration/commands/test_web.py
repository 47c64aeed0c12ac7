"""`pgqctl web`: each page over a real database, through HTTP requests in
this process (starlette's test client) and, for the command itself, as a
process a user starts. The browser's view is test_web_browser.py."""

from __future__ import annotations

import base64
import json
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import run_cli
from tests.support.jobrows import insert_jobs, sh
from tests.support.plans import PLANS, plan_of, rows_read
from tests.support.processes import start_pgqctl, start_worker, web_address

pytest.importorskip("starlette", reason="needs pgqctl[web]")
pytest.importorskip("httpx2", reason="needs httpx2 (pgqctl[test])")

from starlette.testclient import TestClient

from pgqctl import db, monitor
from pgqctl.sql import query
from pgqctl.text import shell_word
from pgqctl.web.app import Settings, make_app
from pgqctl.web.live import Shared

__all__ = ["start_pgqctl", "start_worker"]  # fixtures

TOKEN = "a-token-long-enough-1234"
HOSTILE = "<script>alert('x')</script>"


def client(dsn: str, *, token: str | None = None, base_path: str = "") -> TestClient:
    app = make_app(
        Settings("the test database", token, base_path),
        lambda: db.open_queue(dsn, schema="public"),
    )
    return TestClient(app, base_url="http://localhost")


@pytest.fixture
def web(dsn: str) -> Iterator[TestClient]:
    with client(dsn) as c:
        yield c


def test_every_page_answers_on_an_empty_queue(web: TestClient) -> None:
    for path in ["/", "/jobs", "/workers", "/schedules", "/doctor", "/healthz"]:
        response = web.get(path)
        assert response.status_code == 200, (path, response.text)
    assert "No jobs yet" in web.get("/").text
    assert web.get("/healthz").text == "ok\n"


def test_the_overview_counts_each_queue_and_the_jobs_finished_this_hour(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient, start_worker: Any
) -> None:
    insert_jobs(conn, [{"argv": ["true"]}] * 3 + [{"argv": ["false"]}], max_attempts=1)
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload, run_at) VALUES "
        "('later', 'k', '{}', now()), ('later', 'k', '{}', now() + interval '1 hour')"
    )
    assert start_worker(dsn, "--burst", "--queue", "default").finish() == 0
    page = web.get("/").text
    row = re.search(r"<tr>\s*<td[^>]*><a [^>]*>default</a></td>(.*?)</tr>", page, re.S)
    assert row is not None, page
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    numbers = [re.sub(r"<[^>]+>", "", c).strip() for c in cells]
    # pending, due, running, expired leases, failed, done this hour, failed this hour
    assert numbers[:7] == ["0", "0", "0", "0", "1", "3", "1"], numbers
    later = re.search(r"<tr>\s*<td[^>]*><a [^>]*>later</a></td>(.*?)</tr>", page, re.S)
    assert later is not None
    later_cells = [
        re.sub(r"<[^>]+>", "", c).strip()
        for c in re.findall(r"<td[^>]*>(.*?)</td>", later.group(1), re.S)
    ]
    assert later_cells[:2] == ["2", "1"], later_cells  # two pending, one of them due


def test_jobs_filter_by_status_queue_kind_error_and_id(
    conn: psycopg.Connection[Any], web: TestClient
) -> None:
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload, status, last_error, finished_at) VALUES "
        "('mail', 'send', '{}', 'failed', 'SMTP refused', now()), "
        "('mail', 'send', '{}', 'failed', 'timeout', now()), "
        "('img', 'resize', '{}', 'pending', NULL, NULL)"
    )
    ids = [r[0] for r in conn.execute("SELECT id FROM jobs ORDER BY id")]

    def listed(query: str) -> list[int]:
        response = web.get("/jobs?" + query)
        assert response.status_code == 200, response.text
        return [int(i) for i in re.findall(r'<a href="/jobs/(\d+)">', response.text)]

    assert listed("") == ids[::-1]
    assert listed("status=failed") == [ids[1], ids[0]]
    assert listed("status=failed&error=smtp") == [ids[0]]
    assert listed("queue=img") == [ids[2]]
    assert listed("kind=send&status=pending") == []
    assert listed(f"id={ids[1]}") == [ids[1]]
    assert listed("since=1h") == ids[::-1]
    assert "Not counted" in web.get("/jobs?since=1h").text  # it would read every done job
    assert "Not counted" in web.get("/jobs?error=smtp").text
    assert "1 job matches" in web.get("/jobs?error=smtp&status=failed").text
    bad = web.get("/jobs?status=lost")
    assert bad.status_code == 400 and "unknown status" in bad.text
    assert web.get("/jobs?since=yesterday").status_code == 400


def test_ten_thousand_jobs_page_by_page_each_once_newest_first(
    conn: psycopg.Connection[Any], web: TestClient
) -> None:
    conn.execute("INSERT INTO jobs (kind, payload) SELECT 'k', '{}' FROM generate_series(1, 10000)")
    first = web.get("/jobs").text
    assert "10000 jobs match" in first
    seen: list[int] = []
    query = ""
    while True:
        page = web.get("/jobs?" + query).text
        seen += [int(i) for i in re.findall(r'<a href="/jobs/(\d+)">', page)]
        found = re.search(r'<a rel="next" href="/jobs\?([^"]+)">', page)
        if found is None:
            break
        query = found.group(1).replace("&amp;", "&")
    assert len(seen) == 10_000 and seen == sorted(seen, reverse=True)
    assert 'rel="first" href="/jobs?"' in page  # the last page leads back to the newest
    assert 'rel="first"' not in first


def test_a_job_page_shows_its_attempts_output_and_why_it_waits(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient, start_worker: Any
) -> None:
    (job_id,) = insert_jobs(conn, [sh("echo to stdout; echo to stderr >&2; exit 3")])
    assert start_worker(dsn, "--burst", "--backoff", "3600").finish() == 0
    page = web.get(f"/jobs/{job_id}").text
    assert "failed (exit 3)" in page
    assert "to stderr" in page  # the last words
    assert "pgqctl requeue --id" in page or "run_at" in page  # why: waiting to retry
    output = web.get(f"/jobs/{job_id}/attempts/1").text
    assert "to stdout" in output and "to stderr" in output
    assert web.get(f"/jobs/{job_id}/attempts/7").status_code == 404
    assert web.get("/jobs/999999").status_code == 404
    assert web.get("/jobs/abc").status_code == 400


def test_hostile_rows_are_shown_as_text(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient, start_worker: Any
) -> None:
    payload = sh(f"echo {shell_word(HOSTILE)} >&2; exit 1")
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload, max_attempts) VALUES (%s, %s, %s, 1)",
        (HOSTILE, HOSTILE, json.dumps(payload)),
    )
    assert start_worker(dsn, "--burst").finish() == 0
    (job_id,) = [r[0] for r in conn.execute("SELECT id FROM jobs")]
    assert conn.execute("SELECT count(*) FROM attempts").fetchone() == (1,)
    for path in ["/", "/jobs", f"/jobs/{job_id}", f"/jobs/{job_id}/attempts/1", "/workers"]:
        response = web.get(path)
        assert response.status_code == 200, (path, response.status_code)
        assert HOSTILE not in response.text, path
        assert "&lt;script&gt;" in response.text or path == "/workers", path


def test_a_token_is_asked_for_everywhere_but_the_health_check(dsn: str) -> None:
    with client(dsn, token=TOKEN) as c:
        refused = c.get("/")
        assert refused.status_code == 401 and "Basic" in refused.headers["www-authenticate"]
        assert c.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
        assert c.get("/jobs", headers={"Authorization": f"Basic {basic}"}).status_code == 200
        assert c.get("/healthz").status_code == 200


def test_pages_forbid_frames_and_foreign_scripts(web: TestClient) -> None:
    policy = web.get("/").headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy


def test_a_base_path_prefixes_every_route_and_link(dsn: str) -> None:
    with client(dsn, base_path="/queue") as c:
        page = c.get("/queue/")
        assert page.status_code == 200
        assert 'href="/queue/jobs"' in page.text and 'src="/queue/static/live.js"' in page.text
        assert c.get("/queue/healthz").text == "ok\n"
        assert c.get("/jobs").status_code == 404


def test_the_live_overview_is_a_stream_of_events(dsn: str, web: TestClient) -> None:
    with web.stream("GET", "/events/overview") as events:
        assert events.headers["content-type"].startswith("text/event-stream")
        first = next(events.iter_lines())
    assert first.startswith("data: ")


def test_fifty_open_pages_share_one_read_a_second() -> None:
    made: list[float] = []

    def make() -> int:
        made.append(time.monotonic())
        time.sleep(0.05)  # a read of the database
        return len(made)

    shared = Shared(make, every=1.0)
    deadline = time.monotonic() + 2.5

    def tab() -> None:
        while time.monotonic() < deadline:
            shared.latest()
            time.sleep(0.01)

    tabs = [threading.Thread(target=tab) for _ in range(50)]
    for t in tabs:
        t.start()
    for t in tabs:
        t.join()
    # 2.5 s of fifty tabs asking a hundred times a second: one read a second.
    assert 2 <= len(made) <= 3, made


def test_the_command_serves_until_stopped(dsn: str, start_pgqctl: Any) -> None:
    web = start_pgqctl("web", "--dsn", dsn, "--port", "0", name="web")
    host, port = web_address(web)
    url = f"http://{host}:{port}/"
    with urllib.request.urlopen(url + "healthz", timeout=10) as response:
        assert response.read() == b"ok\n"
    # An open page's stream of events does not hold the stop up.
    with urllib.request.urlopen(url + "events/overview", timeout=10) as events:
        assert events.readline().startswith(b"data: ")
        web.signal(signal.SIGTERM)
        assert web.proc.wait(10) == 0
    assert "stopped serving" in web.log
    assert "Traceback" not in web.log and "ERROR" not in web.log, web.log


def test_another_address_than_loopback_needs_a_token(dsn: str, tmp_path: Path) -> None:
    refused = run_cli("web", "--dsn", dsn, "--host", "0.0.0.0", "--port", "0")
    assert refused.exit_code == 2, refused.stderr
    assert "only with a token" in refused.stderr and "PGQCTL_WEB_TOKEN" in refused.stderr
    short = tmp_path / "token"
    short.write_text("short\n")
    too_short = run_cli("web", "--dsn", dsn, "--token-file", str(short))
    assert too_short.exit_code == 2 and "shorter than 16" in too_short.stderr
    bad_path = run_cli("web", "--dsn", dsn, "--base-path", "/a b")
    assert bad_path.exit_code == 2 and "--base-path" in bad_path.stderr


@pytest.mark.parametrize("plan", PLANS)
def test_the_overview_chart_reads_the_last_hour_not_the_history(
    dsn: str, conn: psycopg.Connection[Any], plan: str
) -> None:
    conn.execute(
        "INSERT INTO jobs (kind, payload, status, attempts, finished_at) "
        "SELECT 'k', '{}', CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'done' END, 1, "
        "       now() - CASE WHEN i <= 30000 THEN interval '2 days' ELSE interval '5 minutes' END "
        "FROM generate_series(1, 30010) AS i"
    )
    conn.execute(
        "INSERT INTO attempts (job_id, claim, attempt, outcome, due_at, claimed_at, started_at, "
        "                      finished_at, recorded_by) "
        "SELECT id, 1, 1, 'done', finished_at - interval '2 s', finished_at - interval '1 s', "
        "       finished_at - interval '1 s', finished_at, 'worker' FROM jobs"
    )
    conn.execute("VACUUM ANALYZE jobs")
    conn.execute("VACUUM ANALYZE attempts")
    with db.connect(dsn, schema="public") as c:
        since = {"since": db.window_start(c, 3600.0)}
        explained = plan_of(c, monitor.with_recent_attempts("web_minutes"), since, plan)
    assert rows_read(explained, "jobs") <= 20, json.dumps(explained, indent=1)
    assert rows_read(explained, "attempts") <= 20, json.dumps(explained, indent=1)
    with client(dsn) as web:
        page = web.get("/").text
    assert ">9<" in page and ">1<" in page  # done and failed in the last hour


def test_a_page_behind_a_lock_says_so_in_one_line(dsn: str) -> None:
    app = make_app(
        Settings("the test database", None, ""),
        lambda: db.open_queue(dsn, schema="public", settings={"lock_timeout": "200ms"}),
    )
    with psycopg.connect(dsn) as holder, TestClient(app, base_url="http://localhost") as web:
        holder.execute("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE")
        page = web.get("/jobs")
        assert page.status_code == 504, page.text
        assert "did not answer in time" in page.text and "Traceback" not in page.text
        holder.rollback()
        assert web.get("/jobs").status_code == 200  # the connection serves again


def test_without_a_token_only_requests_to_localhost_are_answered(web: TestClient) -> None:
    # A site whose name was pointed at 127.0.0.1 (DNS rebinding) is refused.
    assert web.get("/", headers={"Host": "attacker.example:8080"}).status_code == 403
    for host in ["localhost:8080", "127.0.0.1:8080", "[::1]:8080", "localhost"]:
        assert web.get("/jobs", headers={"Host": host}).status_code == 200, host


def test_bad_ids_and_filters_are_bad_requests_not_failures(web: TestClient) -> None:
    for path in [
        "/jobs/%C2%B2",  # a superscript two: a digit to Python, not a number
        "/jobs/%D9%A1%D9%A2",
        "/jobs?id=%C2%B2",
        "/jobs?before=%C2%B2",
        "/jobs/1/attempts/99999999999",
        "/jobs/99999999999999999999",
        "/jobs?queue=%00",
        "/jobs?kind=a%00b",
        "/jobs?error=%00",
    ]:
        response = web.get(path)
        assert response.status_code == 400, (path, response.status_code, response.text)
        assert "Traceback" not in response.text


def test_invisible_and_control_characters_show_escaped(
    conn: psycopg.Connection[Any], web: TestClient
) -> None:
    spoof = "ev\u202eil\u200bq\x1b[31m"
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload, status, last_error, finished_at) "
        "VALUES (%s, %s, '{}', 'failed', %s, now())",
        (spoof, spoof, "line one\r\nline two\x07"),
    )
    (job_id,) = [r[0] for r in conn.execute("SELECT id FROM jobs")]
    for path in ["/", "/jobs", f"/jobs/{job_id}"]:
        page = web.get(path).text
        assert "\u202e" not in page and "\u200b" not in page and "\x1b" not in page, path
        assert "ev\\u202eil\\u200bq\\x1b[31m" in page, path
    page = web.get(f"/jobs/{job_id}").text
    assert "line one\\x0d\nline two\\x07" in page


def test_pages_read_on_a_new_connection_after_the_server_dropped_them(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient
) -> None:
    for _ in range(3):
        assert web.get("/jobs").status_code == 200
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    assert web.get("/healthz").text == "ok\n"
    assert web.get("/jobs").status_code == 200


def test_the_health_check_tells_nothing_when_the_database_is_gone(server_dsn: str) -> None:
    app = make_app(
        Settings("nowhere", None, ""),
        lambda: db.open_queue("postgresql://nobody@127.0.0.1:1/nothing", schema="public"),
    )
    with TestClient(app, base_url="http://localhost") as web:
        response = web.get("/healthz")
    assert (response.status_code, response.text) == (503, "unavailable\n")


def test_the_overview_shows_each_limit_and_what_it_holds_back(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient
) -> None:
    assert (
        run_cli("limit", "set", "--kind", "report", "--concurrency", "1", "--dsn", dsn).exit_code
        == 0
    )
    # Its only seat taken, as a claim takes it: the two due jobs are held back.
    conn.execute(
        "INSERT INTO jobs (kind, payload) SELECT 'report', '{}' FROM generate_series(1, 3)"
    )
    conn.execute(
        "WITH c AS (SELECT ids FROM pgqctl_claim_limited(NULL, NULL, 1)) "
        "UPDATE jobs SET status = 'running', attempts = attempts + 1, seated = true, "
        "locked_by = 'vm:1:0', locked_until = now() + interval '5 minutes' "
        "FROM c WHERE jobs.id = ANY(c.ids)"
    )
    row = re.search(r"<table class=\"limits\">.*?<tbody>(.*?)</tbody>", web.get("/").text, re.S)
    assert row is not None
    cells = [
        re.sub(r"<[^>]+>", "", c).strip()
        for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    ]
    assert cells[:4] == ["kind report", "concurrency 1", "1/1", "2"], cells


def test_an_error_text_search_through_the_history_reads_a_bounded_span_a_page(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: a search for an error text that matched nothing read the whole
    history for one page (1.24 s at 9.8 M done jobs, bench/web_bench.py)."""
    from pgqctl.web import pages

    monkeypatch.setattr(pages, "SEARCH_SPAN", 1000)
    conn.execute(
        "INSERT INTO jobs (kind, payload, status, attempts, finished_at, last_error) "
        "SELECT 'k', '{}', 'done', 2, now(), "
        "       CASE WHEN i IN (100, 2900) THEN 'exit 3: needle' END "
        "FROM generate_series(1, 3000) AS i"
    )
    shown: list[list[int]] = []
    searched: list[str] = []
    path = "/jobs?error=needle"
    while path:
        page = web.get(path).text
        shown.append([int(i) for i in re.findall(r'<td class="n"><a href="/jobs/(\d+)">', page)])
        found = re.search(r"This page searched jobs (\d+) to (\d+)", page)
        assert found, page
        searched.append(f"{found[1]}-{found[2]}")
        older = re.search(r'<a href="(/jobs\?[^"]+)">Older jobs', page)
        path = older[1].replace("&amp;", "&") if older else ""
    assert searched == ["2001-3000", "1001-2000", "1-1000"]
    assert shown == [[2900], [], [100]]

    with db.connect(dsn, schema="public") as c:
        explained = plan_of(
            c,
            query("job_list").replace("{job}", "id"),
            {
                "statuses": None,
                "queues": None,
                "kinds": None,
                "ids": None,
                "since": None,
                "since_at": None,
                "newer_than": None,
                "error": "matches nothing",
                "before": 3001,
                "floor": 2001,
                "limit": 51,
            },
            "custom",
        )
    assert rows_read(explained, "jobs") <= 1000, json.dumps(explained, indent=1)
