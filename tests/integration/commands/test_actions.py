"""`pgqctl actions` and what fills it: the buttons of `pgqctl web
--allow-actions` that change the queue, over a real database through HTTP
requests in this process, with real workers where a job runs; each action
as `pgqctl actions` then lists it. The browser's view is test_web_browser.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.conftest import run_cli
from tests.support.jobrows import insert_jobs, job, sh
from tests.support.processes import start_worker, wait_until

pytest.importorskip("starlette", reason="needs pgqctl[web]")
pytest.importorskip("httpx2", reason="needs httpx2 (pgqctl[test])")

from starlette.testclient import TestClient

from pgqctl import actions, db
from pgqctl.admin import JobFilter
from pgqctl.web.app import Settings, make_app

__all__ = ["start_worker"]  # a fixture

HOSTILE = "<script>alert('x')</script>"


def client(dsn: str, *, allow: bool = True) -> TestClient:
    app = make_app(
        Settings("the test database", None, "", allow),
        lambda: db.open_queue(dsn, schema="public"),
    )
    return TestClient(app, base_url="http://localhost", follow_redirects=False)


@pytest.fixture
def web(dsn: str) -> Iterator[TestClient]:
    with client(dsn) as c:
        yield c


def form_token(page: str) -> str:
    found = re.search(r'name="form_token" value="([^"]+)"', page)
    assert found, page
    return found.group(1)


def post(web: TestClient, path: str, page: str = "/", **fields: Any) -> Any:
    """A form of the page at `page` sent as the browser sends it."""
    token = form_token(web.get(page).text)
    return web.post(path, data={"form_token": token, **fields})


def recorded(dsn: str) -> list[dict[str, Any]]:
    listed = run_cli("actions", "--json", "--dsn", dsn)
    assert listed.exit_code == 0, listed.stderr
    return json.loads(listed.stdout)


def failed_jobs(conn: psycopg.Connection[Any], n: int, kind: str = "k") -> list[int]:
    rows = conn.execute(
        "INSERT INTO jobs (kind, payload, status, attempts, max_attempts, finished_at, "
        "last_error) SELECT %s, '{}', 'failed', 3, 3, now(), 'exit 1' "
        "FROM generate_series(1, %s) RETURNING id",
        (kind, n),
    ).fetchall()
    return [r[0] for r in rows]


def test_without_allow_actions_the_page_only_reads_and_refuses_a_post(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    [job_id] = failed_jobs(conn, 1)
    with client(dsn, allow=False) as web:
        page = web.get(f"/jobs/{job_id}").text
        assert "read-only: start pgqctl web with --allow-actions to act" in page
        assert '<form method="post"' not in page and "Retry" not in page
        refused = web.post(f"/jobs/{job_id}/retry", data={"form_token": "x" * 43})
    assert refused.status_code == 403
    assert job(conn, job_id)["status"] == "failed"
    assert recorded(dsn) == []


def test_a_post_without_the_pages_form_token_or_from_another_site_is_refused(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient
) -> None:
    [job_id] = failed_jobs(conn, 1)
    token = form_token(web.get(f"/jobs/{job_id}").text)
    cases = [
        ({"queue": "x"}, {}),  # no token: what a form on another site would send
        ({"form_token": "not-the-token"}, {}),
        ({"form_token": token}, {"Sec-Fetch-Site": "cross-site"}),
    ]
    for fields, headers in cases:
        refused = web.post(f"/jobs/{job_id}/retry", data=fields, headers=headers)
        assert refused.status_code == 403, (fields, headers, refused.text)
    as_json = web.post(f"/jobs/{job_id}/retry", json={"form_token": token})
    assert as_json.status_code == 400
    assert web.get(f"/jobs/{job_id}/retry").status_code == 405  # only POST acts
    assert job(conn, job_id)["status"] == "failed"
    assert recorded(dsn) == []


def test_retry_run_now_and_cancel_change_the_job_and_are_recorded(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient
) -> None:
    [failed] = failed_jobs(conn, 1)
    [later] = insert_jobs(conn, [sh("true")])
    conn.execute("UPDATE jobs SET run_at = now() + interval '1 day' WHERE id = %s", (later,))
    done = post(web, f"/jobs/{failed}/retry", f"/jobs/{failed}")
    assert done.status_code == 303
    assert done.headers["location"] == f"/jobs/{failed}?done=retried"
    assert "Retried: the job is pending again" in web.get(done.headers["location"]).text
    row = job(conn, failed)
    assert (row["status"], row["attempts"], row["max_attempts"]) == ("pending", 3, 4)

    post(web, f"/jobs/{later}/run-now", f"/jobs/{later}")
    assert conn.execute("SELECT run_at <= now() FROM jobs WHERE id = %s", (later,)).fetchone() == (
        True,
    )
    gone = post(web, f"/jobs/{later}/cancel", f"/jobs/{later}")
    assert gone.headers["location"] == f"/jobs/{later}?done=cancelled"
    row = job(conn, later)
    assert row["status"] == "cancelled"
    assert row["last_error"] == "cancelled: from the web page by local@testclient"

    # Again, on a job that can no longer be cancelled: nothing changes, and it says so.
    again = web.post(f"/jobs/{later}/cancel", data={"form_token": form_token(web.get("/").text)})
    assert again.headers["location"] == f"/jobs/{later}?done=unchanged&status=cancelled"
    assert "Nothing changed: the job is cancelled now." in web.get(again.headers["location"]).text
    log = recorded(dsn)
    assert [(a["action"], a["target"], a["jobs"], a["actor"]) for a in reversed(log)] == [
        ("retry", {"job": failed}, 1, "local@testclient"),
        ("run_now", {"job": later}, 1, "local@testclient"),
        ("cancel", {"job": later}, 1, "local@testclient"),
    ]
    assert all(a["finished"] for a in log)
    human = run_cli("actions", "--dsn", dsn, "--format", "plain")
    assert human.exit_code == 0
    assert re.search(r"local@testclient\s+cancel\s+job \d+\s+1\n", human.stdout), human.stdout


def test_cancel_stops_a_running_job_on_its_worker(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient, start_worker: Any
) -> None:
    [job_id] = insert_jobs(conn, [sh("sleep 600")])
    worker = start_worker(dsn)
    wait_until(lambda: job(conn, job_id)["status"] == "running", 30, "the job to start")
    post(web, f"/jobs/{job_id}/cancel", f"/jobs/{job_id}")
    assert job(conn, job_id)["status"] == "cancelled"
    worker.wait_for_log(f"job {job_id} cancelled")
    assert f"job {job_id} cancelled" in worker.log


def test_pause_and_resume_a_queue_from_the_overview(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient
) -> None:
    [one] = insert_jobs(conn, [sh("true")])
    conn.execute("UPDATE jobs SET queue = %s WHERE id = %s", (HOSTILE, one))
    page = web.get("/").text
    assert HOSTILE not in page  # the name is text, in the form too
    paused = post(web, "/queues/pause", queue=HOSTILE)
    assert paused.status_code == 303
    shown = web.get(paused.headers["location"]).text
    assert " paused: workers claim none of its jobs" in shown and HOSTILE not in shown
    reason = conn.execute("SELECT reason FROM paused_queues WHERE queue = %s", (HOSTILE,))
    assert reason.fetchone() == ("from the web page by local@testclient",)
    # Paused meanwhile by someone else: a Pause from an older page leaves that pause.
    conn.execute("UPDATE paused_queues SET reason = 'maintenance window'")
    again = post(web, "/queues/pause", queue=HOSTILE)
    assert "done=already_paused" in again.headers["location"]
    assert "was paused already" in web.get(again.headers["location"]).text
    reason = conn.execute("SELECT reason FROM paused_queues WHERE queue = %s", (HOSTILE,))
    assert reason.fetchone() == ("maintenance window",)

    post(web, "/queues/resume", queue=HOSTILE)
    assert conn.execute("SELECT count(*) FROM paused_queues").fetchone() == (0,)
    resumed_again = post(web, "/queues/resume", queue=HOSTILE)
    assert "not_paused" in resumed_again.headers["location"]
    assert [(a["action"], a["target"]) for a in reversed(recorded(dsn))] == [
        ("pause", {"queue": HOSTILE}),
        ("resume", {"queue": HOSTILE}),
    ]


def test_requeue_what_a_filter_matches_after_a_confirmation_with_its_count(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient
) -> None:
    matching = failed_jobs(conn, 1200, kind="import")
    others = failed_jobs(conn, 5, kind="report")
    confirm = web.get("/act?action=requeue_matching&kind=import&status=failed")
    assert confirm.status_code == 200
    assert "<strong>1,200</strong> failed jobs" in confirm.text
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm.text))
    assert fields["ids"] == f"{min(matching)}-{max(matching)}" and fields["kind"] == "import"
    assert "The filter, as this action takes it: status failed, kind import." in confirm.text
    assert conn.execute("SELECT count(*) FROM jobs WHERE status = 'pending'").fetchone() == (0,)

    done = web.post("/act", data=fields)
    assert done.status_code == 303 and done.headers["location"].startswith("/actions?done=")
    by_status = dict(
        conn.execute(
            "SELECT status, count(*) FROM jobs WHERE id = ANY(%s) GROUP BY 1", (matching,)
        ).fetchall()
    )
    assert by_status == {"pending": 1200}
    assert {job(conn, i)["status"] for i in others} == {"failed"}
    [entry] = recorded(dsn)
    assert (entry["action"], entry["jobs"], entry["finished"]) == ("requeue_matching", 1200, True)
    assert entry["target"] == {"filter": {"kind": "import", "status": ["failed"]}}
    shown = web.get(done.headers["location"]).text
    assert "Requeued 1,200 jobs: jobs with status failed, kind import." in shown


def test_an_action_on_matching_jobs_takes_only_the_jobs_confirmed(
    dsn: str, conn: psycopg.Connection[Any], web: TestClient
) -> None:
    failed_jobs(conn, 30, kind="import")
    nothing = web.get("/act?action=cancel_matching&kind=import").text
    assert "No job that this can cancel matches" in nothing
    confirmed = insert_jobs(conn, [sh("true")] * 30, kind="import")
    confirm = web.get("/act?action=cancel_matching&kind=import").text
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', confirm))
    # Before the click: one confirmed job ends, and ten new ones match.
    conn.execute(
        "UPDATE jobs SET status = 'done', finished_at = now() WHERE id = %s", (confirmed[0],)
    )
    later = insert_jobs(conn, [sh("true")] * 10, kind="import")
    assert web.post("/act", data=fields).status_code == 303
    assert {job(conn, i)["status"] for i in confirmed[1:]} == {"cancelled"}
    assert job(conn, confirmed[0])["status"] == "done"
    assert {job(conn, i)["status"] for i in later} == {"pending"}
    [entry] = recorded(dsn)
    assert (entry["jobs"], entry["target"]) == (
        29,
        {"filter": {"kind": "import", "status": ["pending", "running"]}},
    )
    forged = web.post("/act", data={**fields, "ids": "1-20000"})
    assert forged.status_code == 400 and "more than 10,000 jobs" in forged.text


def test_an_action_on_matching_jobs_goes_in_batches_with_a_pause_between(
    conn: psycopg.Connection[Any], dsn: str
) -> None:
    failed_jobs(conn, 1200, kind="import")
    pauses: list[float] = []
    seen: list[int] = []

    def pause(seconds: float) -> None:
        # Between batches, the part done so far is committed and recorded.
        with psycopg.connect(dsn) as other:
            row = other.execute("SELECT jobs, finished FROM actions").fetchone()
        assert row is not None and row[1] is False
        seen.append(row[0])
        pauses.append(seconds)

    with db.open_queue(dsn, schema="public") as q:
        found = JobFilter(kinds=("import",))
        action_id, changed = actions.act_on_matching(
            q,
            "requeue_matching",
            found,
            actions.preview(q, "requeue_matching", found),
            "ops@10.0.0.1",
            target={"filter": {"kind": "import"}},
            pause=pause,
        )
    assert changed == 1200 and action_id > 0
    assert seen == [500, 1000] and pauses == [actions.BATCH_PAUSE_SECONDS] * 2
    assert conn.execute("SELECT jobs, finished FROM actions").fetchone() == (1200, True)


def test_a_role_that_may_only_read_gets_a_read_only_page_that_says_why(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    [job_id] = failed_jobs(conn, 1)
    role = "pgqctl_web_reader"
    conn.execute(f"DROP ROLE IF EXISTS {role}")
    conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        conn.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
        reader = psycopg.conninfo.make_conninfo(dsn, user=role)
        with client(reader) as web:
            page = web.get(f"/jobs/{job_id}").text
            assert f"read-only: the role {role} lacks UPDATE on jobs" in page
            assert "Retry" not in page
            refused = web.post(f"/jobs/{job_id}/retry", data={"form_token": "x" * 43})
        assert refused.status_code == 403 and "lacks UPDATE on jobs" in refused.text
    finally:
        conn.execute(f"REASSIGN OWNED BY {role} TO current_user")
        conn.execute(f"DROP OWNED BY {role}")
        conn.execute(f"DROP ROLE {role}")
    assert job(conn, job_id)["status"] == "failed"


def test_a_filter_an_action_cannot_take_is_a_bad_request(web: TestClient) -> None:
    refused = web.get("/act?action=requeue_matching&status=running")
    assert refused.status_code == 400
    assert "requeue takes failed or cancelled jobs" in refused.text
    assert web.get("/act?action=drop_everything").status_code == 400
