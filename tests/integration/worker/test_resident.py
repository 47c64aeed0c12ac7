"""Resident handlers (`worker --serve KIND=COMMAND`): real handler processes
kept running by a real worker, fed jobs as lines; what a handler that
fails, dies, talks nonsense, hangs or is cancelled costs; and that none
outlives its worker, even one killed with kill -9."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import psycopg

from tests.conftest import alive, gone, run_cli
from tests.support.jobrows import insert_jobs, job
from tests.support.processes import start_worker, wait_until
from tests.support.servers import REPO_ROOT

__all__ = ["start_worker"]  # a fixture

# A handler that does what each job's payload says: nothing (done), fail,
# retry, exit, answer nonsense, or sleep first.
HANDLER = r"""
import json, os, sys, time
print(f"handler {os.getpid()} up", file=sys.stderr, flush=True)
for line in sys.stdin:
    job = json.loads(line)
    do = job["payload"].get("do", "ok")
    print(f"working on {job['id']} ({do}), attempt {job['attempt']}", file=sys.stderr, flush=True)
    time.sleep(job["payload"].get("sleep", 0))
    if do == "fail":
        answer = {"id": job["id"], "status": "failed", "error": "the disk is full"}
    elif do == "retry":
        answer = {"id": job["id"], "status": "retry", "after": 300, "error": "rate limited"}
    elif do == "exit":
        sys.exit(3)
    elif do == "nonsense":
        print("OK!", flush=True)
        continue
    else:
        answer = {"id": job["id"], "status": "done"}
    print(json.dumps(answer), flush=True)
"""

STARTED = re.compile(r"job (\d+) started: .*pid (\d+)\)")


def handler(tmp_path: Path) -> str:
    path = tmp_path / "handler.py"
    path.write_text(HANDLER)
    return f"work={sys.executable} {path}"


def pids(log: str) -> dict[int, int]:
    """Each job's handler process on its first attempt, from the worker's
    started lines (a retry may run on another, once the backoff is over)."""
    found: dict[int, int] = {}
    for j, p in STARTED.findall(log):
        found.setdefault(int(j), int(p))
    return found


def test_jobs_of_a_served_kind_share_one_process_per_slot(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any, tmp_path: Path
) -> None:
    ids = insert_jobs(conn, [{"do": "ok"}] * 40, kind="work")
    worker = start_worker(dsn, "--burst", "--concurrency", "2", "--serve", handler(tmp_path))
    assert worker.finish() == 0, worker.log
    assert {job(conn, i)["status"] for i in ids} == {"done"}
    used = set(pids(worker.log).values())
    assert 1 <= len(used) <= 2, used  # one per slot, not one per job
    # Each job's stderr is its own: in the log and in its attempt's output.
    assert f"job {ids[7]} | working on {ids[7]} (ok), attempt 1" in worker.log
    logs = run_cli("logs", str(ids[7]), "--dsn", dsn)
    assert logs.exit_code == 0 and f"working on {ids[7]} (ok)" in logs.stdout
    # None outlives the worker.
    assert all(gone(pid, 10) for pid in used)


def test_a_failure_a_retry_a_death_or_nonsense_ends_only_that_job(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any, tmp_path: Path
) -> None:
    asks = ["fail", "retry", "exit", "nonsense", "ok"]
    ids = insert_jobs(conn, [{"do": do} for do in asks], kind="work", max_attempts=2)
    worker = start_worker(dsn, "--burst", "--concurrency", "1", "--serve", handler(tmp_path))
    assert worker.finish() == 0, worker.log
    rows = {do: job(conn, i) for do, i in zip(asks, ids, strict=True)}
    # A failure: retried with the backoff, its error the handler's.
    assert rows["fail"]["last_error"].startswith("the disk is full")
    # A retry: pending again, due when the handler asked (300 s), not by the backoff.
    retry = rows["retry"]
    assert (retry["status"], retry["attempts"]) == ("pending", 1)
    assert retry["last_error"].startswith("rate limited")
    due_in = conn.execute(
        "SELECT extract(epoch FROM run_at - now()) FROM jobs WHERE id = %s", (ids[1],)
    ).fetchone()
    assert due_in is not None and 250 < float(due_in[0]) <= 300
    assert rows["exit"]["last_error"].startswith(
        f"the resident handler exited (exit status 3) before answering for job {ids[2]}"
    )
    assert rows["nonsense"]["last_error"].startswith(
        f"the resident handler answered what is not job {ids[3]}'s result: 'OK!'"
    )
    assert rows["ok"]["status"] == "done"
    used = pids(worker.log)
    # The death and the nonsense each cost a new process; the others kept theirs.
    assert used[ids[0]] == used[ids[1]] == used[ids[2]]
    assert len({used[ids[2]], used[ids[3]], used[ids[4]]}) == 3


def test_a_timeout_kills_the_handler_and_the_next_job_gets_a_new_one(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any, tmp_path: Path
) -> None:
    ids = insert_jobs(conn, [{"sleep": 600}, {"do": "ok"}], kind="work", max_attempts=1)
    worker = start_worker(
        dsn, "--burst", "--concurrency", "1", "--timeout", "1s", "--serve", handler(tmp_path)
    )
    assert worker.finish() == 0, worker.log
    first, second = job(conn, ids[0]), job(conn, ids[1])
    assert first["status"] == "failed" and first["last_error"].startswith("timed out after 1s")
    assert second["status"] == "done"
    used = pids(worker.log)
    assert used[ids[0]] != used[ids[1]] and gone(used[ids[0]], 10)


def test_a_handler_that_reads_nothing_is_stopped_by_the_timeout(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any, tmp_path: Path
) -> None:
    # A line far larger than a pipe holds, to a handler that never reads it.
    deaf = tmp_path / "deaf.py"
    deaf.write_text("import time\ntime.sleep(600)\n")
    [job_id] = insert_jobs(conn, [{"blob": "x" * 300_000}], kind="deaf", max_attempts=1)
    worker = start_worker(
        dsn, "--burst", "--timeout", "1s", "--serve", f"deaf={sys.executable} {deaf}"
    )
    assert worker.finish() == 0, worker.log
    row = job(conn, job_id)
    assert (row["status"], row["last_error"][:19]) == ("failed", "timed out after 1s")
    assert gone(pids(worker.log)[job_id], 10)


def running_handler(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any, tmp_path: Path
) -> tuple[Any, int, int]:
    """A worker whose handler runs a job of ten minutes: (the worker, the
    job's id, the handler's pid)."""
    [job_id] = insert_jobs(conn, [{"sleep": 600}], kind="work")
    worker = start_worker(dsn, "--concurrency", "1", "--serve", handler(tmp_path))
    wait_until(lambda: job_id in pids(worker.log), 30, "the job to start")
    return worker, job_id, pids(worker.log)[job_id]


def test_cancel_kills_the_handler_running_the_job(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any, tmp_path: Path
) -> None:
    worker, job_id, pid = running_handler(dsn, conn, start_worker, tmp_path)
    assert run_cli("cancel", "--id", str(job_id), "--dsn", dsn).exit_code == 0
    worker.wait_for_log(f"job {job_id} cancelled")
    assert gone(pid, 10)
    assert job(conn, job_id)["status"] == "cancelled"
    worker.signal(signal.SIGTERM)
    assert worker.finish() == 0


def test_max_jobs_per_process_recycles_the_handler(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any, tmp_path: Path
) -> None:
    ids = insert_jobs(conn, [{"do": "ok"}] * 7, kind="work")
    worker = start_worker(
        dsn,
        "--burst",
        "--concurrency",
        "1",
        "--max-jobs-per-process",
        "3",
        "--serve",
        handler(tmp_path),
    )
    assert worker.finish() == 0, worker.log
    used = pids(worker.log)
    by_process = [used[i] for i in sorted(ids)]
    assert len(set(by_process)) == 3  # 3 + 3 + 1
    assert by_process[0] == by_process[2] != by_process[3] == by_process[5] != by_process[6]


def test_a_killed_worker_leaves_no_handler_running(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any, tmp_path: Path
) -> None:
    worker, _, pid = running_handler(dsn, conn, start_worker, tmp_path)
    assert alive(pid)
    worker.proc.kill()  # kill -9: its guard stops the handler's group
    worker.proc.wait()
    assert gone(pid, 30)


def readme_block(language: str) -> str:
    """The README's resident handler in `language` (its code block after `In ...`)."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("## Resident handlers", 1)[1].split("\n## ", 1)[0]
    found = re.search(rf"```{language}\n(.*?)```", section, re.S)
    assert found, f"no {language} block in the README's Resident handlers"
    return found.group(1)


def test_the_readmes_python_and_shell_handlers_run_as_they_are(
    dsn: str, conn: psycopg.Connection[Any], start_worker: Any, tmp_path: Path
) -> None:
    python = tmp_path / "thumbnails.py"
    python.write_text(readme_block("python"))
    shell = tmp_path / "handler.sh"
    shell.write_text(readme_block("sh"))
    os.chmod(shell, 0o755)
    pictures = insert_jobs(conn, [{"image": f"{n}.png"} for n in range(5)], kind="thumbnail")
    broken = insert_jobs(conn, [{"no": "image"}], kind="thumbnail", max_attempts=1)
    shelled = insert_jobs(conn, [{"n": n} for n in range(5)], kind="sh")
    worker = start_worker(
        dsn,
        "--burst",
        "--serve",
        f"thumbnail={sys.executable} {python}",
        "--serve",
        f"sh={shell}",
    )
    assert worker.finish() == 0, worker.log
    assert {job(conn, i)["status"] for i in pictures + shelled} == {"done"}
    assert f"job {pictures[2]} | thumbnail of 2.png" in worker.log
    assert f"job {shelled[3]} | handling job {shelled[3]}" in worker.log
    failed = job(conn, broken[0])
    assert (failed["status"], failed["last_error"].splitlines()[0]) == ("failed", "'image'")


def test_a_kind_served_and_handled_otherwise_is_refused(dsn: str) -> None:
    both = run_cli("worker", "--dsn", dsn, "--serve", "k=true", "--handler", "k=true")
    assert both.exit_code == 2
    assert "kind 'k' has a --serve and a --handler or --sql: give it one of them" in both.stderr
    twice = run_cli("worker", "--dsn", dsn, "--serve", "k=true", "--serve", "k=false")
    assert twice.exit_code == 2 and "--serve given twice for kind 'k'" in twice.stderr
