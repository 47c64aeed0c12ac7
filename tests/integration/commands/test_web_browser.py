"""`pgqctl web` in a real browser: Debian's Chromium, headless, driven by
Playwright (no browser download: it runs the system's binary). Without
Chromium or Playwright these tests skip, saying which is missing; under CI
they fail instead (tests/support/servers.py `missing`)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.jobrows import insert_jobs, sh
from tests.support.processes import PgqctlProcess, start_pgqctl, start_worker, web_address
from tests.support.servers import missing

__all__ = ["start_pgqctl", "start_worker"]  # fixtures

TOKEN = "a-browser-token-1234567"
HOSTILE = "<img src=x onerror=document.title='owned'>"


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        missing("needs Chromium: apt-get install chromium")
    return found


@pytest.fixture
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("needs playwright: pip install playwright (pgqctl[test] has it)")
    executable = chromium_path()
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


def serve(start_pgqctl: Any, dsn: str, *args: str) -> tuple[PgqctlProcess, str]:
    web = start_pgqctl("web", "--dsn", dsn, "--port", "0", *args, name="web")
    host, port = web_address(web)
    return web, f"http://{host}:{port}"


def test_the_overview_changes_as_a_worker_runs_without_reloading(
    dsn: str, conn: psycopg.Connection[Any], browser: Any, start_pgqctl: Any, start_worker: Any
) -> None:
    insert_jobs(conn, [sh("sleep 0.05")] * 40)
    _, url = serve(start_pgqctl, dsn)
    page = browser.new_page()
    page.goto(url + "/")
    cell = page.locator("table.queues tbody tr", has_text="default").locator("td").nth(1)
    assert cell.inner_text() == "40"  # pending
    page.evaluate("window.loadedOnce = true")
    worker = start_worker(dsn, "--burst", "--concurrency", "4")
    page.wait_for_function(
        "() => document.querySelector('table.queues tbody tr td:nth-child(7)')"
        "?.textContent.trim() === '40'",
        timeout=30_000,
    )  # done in the last hour, as the stream sent it
    assert page.evaluate("window.loadedOnce") is True  # the same page: not reloaded
    assert worker.finish() == 0


@pytest.mark.slow
def test_filter_page_through_ten_thousand_jobs_and_open_one(
    dsn: str, conn: psycopg.Connection[Any], browser: Any, start_pgqctl: Any
) -> None:
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload) "
        "SELECT CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END, 'k', jsonb_build_object('i', i) "
        "FROM generate_series(1, 10000) AS i"
    )
    _, url = serve(start_pgqctl, dsn)
    page = browser.new_page()
    page.goto(url + "/jobs")
    page.fill("input[name=queue]", "even")
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert "5000 jobs match" in page.inner_text("main")
    page.goto(url + "/jobs")
    seen: list[int] = []
    while True:
        seen += [
            int(t) for t in page.locator("table.jobs tbody td:first-child a").all_inner_texts()
        ]
        older = page.locator("a[rel=next]")
        if older.count() == 0:
            break
        with page.expect_navigation():  # the next page, not this one read again
            older.click()
    assert len(seen) == 10_000 and seen == sorted(seen, reverse=True)
    page.click(f"table.jobs a[href$='/jobs/{seen[-1]}']")
    assert page.locator("h1").inner_text().startswith(f"Job {seen[-1]}")
    assert '"i": 1' in page.inner_text("details.payload pre")


def test_a_hostile_row_is_text_and_runs_nothing(
    dsn: str, conn: psycopg.Connection[Any], browser: Any, start_pgqctl: Any
) -> None:
    conn.execute(
        "INSERT INTO jobs (queue, kind, payload, status, last_error, finished_at) "
        "VALUES (%s, %s, %s, 'failed', %s, now())",
        (HOSTILE, HOSTILE, json.dumps({"note": HOSTILE}), HOSTILE),
    )
    (job_id,) = [r[0] for r in conn.execute("SELECT id FROM jobs")]
    _, url = serve(start_pgqctl, dsn)
    page = browser.new_page()
    for path in ["/", "/jobs", f"/jobs/{job_id}"]:
        page.goto(url + path)
        page.wait_for_timeout(300)
        assert page.title() != "owned", path
        assert page.locator("img").count() == 0, path
        assert HOSTILE in page.inner_text("main"), path


def test_without_the_token_the_browser_is_refused(
    dsn: str, browser: Any, start_pgqctl: Any, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    _, url = serve(start_pgqctl, dsn, "--token-file", str(token_file))
    from playwright.sync_api import Error

    with pytest.raises(Error, match="ERR_INVALID_AUTH_CREDENTIALS"):
        browser.new_page().goto(url + "/")  # asked for the token, given none
    wrong = browser.new_context(http_credentials={"username": "me", "password": "guess"})
    guessed = wrong.new_page()
    assert guessed.goto(url + "/").status == 401  # the browser gave up: the refusal shown
    assert "needs its token" in guessed.inner_text("body")
    right = browser.new_context(http_credentials={"username": "me", "password": TOKEN})
    page = right.new_page()
    assert page.goto(url + "/jobs").status == 200
    assert page.locator("h1, table.jobs").count() >= 1


def test_pause_and_resume_a_queue_then_cancel_a_running_job_and_see_it_end(
    dsn: str,
    conn: psycopg.Connection[Any],
    browser: Any,
    start_pgqctl: Any,
    start_worker: Any,
    tmp_path: Path,
) -> None:
    (job_id,) = insert_jobs(conn, [sh("sleep 600")])
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    _, url = serve(start_pgqctl, dsn, "--allow-actions", "--token-file", str(token_file))
    context = browser.new_context(http_credentials={"username": "ana", "password": TOKEN})
    page = context.new_page()
    page.goto(url + "/")
    row = page.locator("table.queues tbody tr", has_text="default")
    with page.expect_navigation():
        row.get_by_role("button", name="Pause").click()
    assert "paused: workers claim none" in page.inner_text("p.notice")
    page.wait_for_function(
        "() => document.querySelector('table.queues tbody tr')?.textContent"
        ".includes('paused: from the web page by ana@')",
        timeout=10_000,
    )
    worker = start_worker(dsn, "--concurrency", "1")
    page.wait_for_timeout(1500)  # a paused queue: the worker claims nothing
    assert conn.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone() == (
        "pending",
    )
    with page.expect_navigation():
        page.locator("table.queues tbody tr", has_text="default").get_by_role(
            "button", name="Resume"
        ).click()
    assert "resumed: workers claim its jobs again" in page.inner_text("p.notice")

    page.goto(f"{url}/jobs/{job_id}")
    for _ in range(100):  # the job starts on the worker
        if page.locator("h1 .status").inner_text() == "running":
            break
        page.wait_for_timeout(200)
        page.reload()
    assert page.locator("h1 .status").inner_text() == "running"
    with page.expect_navigation():
        page.get_by_role("button", name="Cancel").click()
    assert page.locator("h1 .status").inner_text() == "cancelled"
    assert "Cancelled: a worker running it stops it" in page.inner_text("p.notice")
    worker.wait_for_log(f"job {job_id} cancelled")  # its worker stopped the process
    page.goto(url + "/actions")
    log = page.inner_text("table.actions-log tbody")
    assert [line.split("\t")[2] for line in log.splitlines()] == ["cancel", "resume", "pause"]
    assert all("ana@" in line for line in log.splitlines())
