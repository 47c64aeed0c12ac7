"""Threads kept for the jobs that need one each while they run (a SQL job's
statement, a resident handler's line and answer), reused from job to job.

There are always at least as many threads as such jobs, so a job never
waits for another's end. Starting a thread per job instead made the
worker's loop wait, for each job, until the new thread had been scheduled:
about 0.2 ms a job on 2 busy cores, more than the rest of a resident job.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class KeptThreads:
    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[Any], None]] | None] = (
            queue.SimpleQueue()
        )
        self._busy = 0  # tasks run and not yet over
        self._threads = 0
        self._closed = False

    def run(self, work: Callable[[], T], then: Callable[[T], None]) -> None:
        """`then(work())` on a kept thread. `work` must not raise; its thread
        is free again before `then` runs, so that what `then` starts (the
        next job) finds it free."""
        with self._lock:
            if self._closed:
                threading.Thread(target=_once, args=(work, then), daemon=True).start()
                return
            self._busy += 1
            start = self._busy > self._threads
            if start:
                self._threads += 1
                name = f"{self._name}-{self._threads}"
        if start:
            try:
                threading.Thread(target=self._serve, name=name, daemon=True).start()
            except BaseException:
                # No thread (a limit on processes): the caller reports the
                # job itself, so the task must never run.
                self._gone(busy=1)
                raise
        self._tasks.put((work, then))

    def close(self) -> None:
        """Let each thread end once its task is over; a task run after this
        gets a thread that ends with it."""
        with self._lock:
            self._closed = True
            for _ in range(self._threads):
                self._tasks.put(None)

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            work, then = task
            try:
                result = work()
            except BaseException:
                self._gone(busy=1)
                raise
            with self._lock:
                self._busy -= 1
            try:
                then(result)
            except BaseException:
                self._gone(busy=0)
                raise

    def _gone(self, busy: int) -> None:
        """A thread is gone (its task raised, which threading reports) or
        never started: one takes its place if a task may be left waiting."""
        with self._lock:
            self._busy -= busy
            self._threads -= 1
            replace = self._busy > self._threads
            if replace:
                self._threads += 1
        if replace:
            threading.Thread(target=self._serve, name=self._name, daemon=True).start()


def _once(work: Callable[[], T], then: Callable[[T], None]) -> None:
    then(work())
