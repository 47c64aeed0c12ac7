"""The threads kept for jobs: reused from job to job, never fewer than the
jobs running at once, and not lost to a task that raises."""

from __future__ import annotations

import threading

from pgqctl.threads import KeptThreads


def test_tasks_one_after_another_share_one_thread() -> None:
    threads = KeptThreads("test")
    used: list[str] = []
    done = threading.Semaphore(0)

    def ran(name: str) -> None:
        used.append(name)
        done.release()

    for _ in range(20):
        threads.run(lambda: threading.current_thread().name, ran)
        assert done.acquire(timeout=5)
    threads.close()
    assert set(used) == {"test-1"}


def test_no_task_waits_for_another_to_end() -> None:
    threads = KeptThreads("test")
    release = threading.Event()
    started = threading.Semaphore(0)
    ended = threading.Semaphore(0)

    def held() -> None:
        started.release()
        release.wait(10)

    for _ in range(5):
        threads.run(held, lambda _: ended.release())
    # All five run at once: none is queued behind another.
    assert all(started.acquire(timeout=5) for _ in range(5))
    release.set()
    assert all(ended.acquire(timeout=5) for _ in range(5))
    threads.close()


def test_a_task_that_raises_leaves_the_others_a_thread() -> None:
    threads = KeptThreads("test")
    raised = threading.Event()
    previous = threading.excepthook
    threading.excepthook = lambda args: raised.set()  # its thread reports it; noted here
    try:
        threads.run(lambda: 1 / 0, lambda _: None)
        assert raised.wait(5)
        # Two tasks that each hold their thread: both run at once.
        release = threading.Event()
        started = threading.Semaphore(0)

        def held() -> None:
            started.release()
            release.wait(10)

        threads.run(held, lambda _: None)
        threads.run(held, lambda _: None)
        assert started.acquire(timeout=5) and started.acquire(timeout=5)
        release.set()
    finally:
        threading.excepthook = previous
        threads.close()


def test_a_task_run_after_close_still_runs() -> None:
    threads = KeptThreads("test")
    threads.close()
    done = threading.Event()
    threads.run(lambda: 7, lambda value: done.set() if value == 7 else None)
    assert done.wait(5)
