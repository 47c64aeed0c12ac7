"""Resident handlers: for a kind served with `worker --serve KIND=COMMAND`,
COMMAND is started once and kept running, and each job of that kind is one
line written to its stdin and one line read back from its stdout. A job
then costs a write and a read instead of starting an interpreter.

The protocol (version 1, docs/worker.md "Resident handlers"): the worker
writes one JSON object per job on a line of its own,

    {"v": 1, "id": 42, "attempt": 1, "claim": 1, "kind": "resize",
     "queue": "default", "payload": {...}, "deadline": 1764860000.5}

(`deadline`: the Unix time its --timeout ends, or null) and reads one line
back: {"id": 42, "status": "done"}, {"id": 42, "status": "failed", "error":
"..."} or {"id": 42, "status": "retry", "after": 30, "error": "..."}. A
handler writes what it has to say about a job to stderr, which is that
job's output; its stdout carries result lines only.

Each job runs on a thread of its own while it runs (threads are kept and
reused from job to job), on a process of its kind that no other job is
using (so at most --concurrency of them per kind). A process
that dies, or answers with anything but a result line for its job, fails
only that job and is started again for the next one, after a pause that
grows while it keeps failing. A timeout, a cancel or the worker's stop
kills the process (its whole process group, SIGTERM then SIGKILL), as for a
job's own process; the next job starts a new one. With
`max_jobs_per_process`, a process is retired (its stdin closed) after that
many jobs. Nothing here prints.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgqctl import runner
from pgqctl.threads import KeptThreads

PROTOCOL = 1
# How often a job's thread looks at its stop request and deadline while the
# handler is silent.
TICK = 0.05
# A failed start or a death starts the next process after this, doubling
# while it goes on, up to RESTART_CAP.
RESTART_FIRST = 0.5
RESTART_CAP = 30.0
# A retired process (stdin closed) gets this long to exit before it is killed.
RETIRE_GRACE = 2.0
# The longest result line read: anything longer is not an answer.
MAX_RESULT_BYTES = 1024 * 1024
ERROR_CHARS = 2000


@dataclass(frozen=True)
class ResidentResult:
    """How a job on a resident handler ended: its outcome (as a job's process
    would have), and `retry_after` seconds when the handler asked for a retry."""

    outcome: runner.Outcome
    retry_after: float | None = None


class _Process:
    """One running handler process."""

    def __init__(self, kind: str, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.kind = kind
        self.proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            start_new_session=True,  # its own group, killed whole
            bufsize=0,
        )
        self.pid = self.proc.pid
        self.jobs = 0
        self.pending = b""  # stdout read past a result line

    def exit_text(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "still running"
        return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


class ResidentJobs:
    def __init__(
        self,
        serve: Mapping[str, Sequence[str]],
        env: Mapping[str, str],
        *,
        on_started: Callable[[object, int], None],
        on_done: Callable[[object, ResidentResult], None],
        guard: runner.GroupTracker | None = None,
        term_grace: float = 5.0,
        max_jobs_per_process: int | None = None,
        keep: runner.OutputKeep = runner.NO_KEEP,
    ) -> None:
        self.serve = dict(serve)
        self.env = dict(env)
        self._on_started = on_started
        self._on_done = on_done
        self._guard = guard
        self._term_grace = term_grace
        self._max_jobs = max_jobs_per_process
        self._keep = keep
        self._lock = threading.Lock()
        self._idle: dict[str, list[_Process]] = {kind: [] for kind in self.serve}
        self._failures: dict[str, int] = dict.fromkeys(self.serve, 0)
        self._restart_at: dict[str, float] = dict.fromkeys(self.serve, 0.0)
        self._closed = False
        self._threads = KeptThreads("pgqctl-resident")

    def __contains__(self, kind: object) -> bool:
        return kind in self.serve

    def submit(
        self,
        key: object,
        *,
        request: Mapping[str, Any],
        timeout: float | None,
        stop: runner.Stop,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        """Run one job (`request`: the protocol's fields but `v` and
        `deadline`) on a process of its kind, on a thread of its own while
        it runs; `on_done(key, result)` says how it ended, once."""
        request = dict(request)

        def work() -> ResidentResult:
            try:
                return self._run(request, timeout, stop, on_line, key)
            except Exception as exc:  # never lose the job's report
                error = f"worker error running the resident handler: {exc}"
                return ResidentResult(runner.Outcome(error=error))

        self._threads.run(work, lambda result: self._on_done(key, result))

    def close(self) -> None:
        """Retire every idle process (the jobs still running were stopped
        by the worker before)."""
        with self._lock:
            self._closed = True
            idle = [p for procs in self._idle.values() for p in procs]
            for procs in self._idle.values():
                procs.clear()
        self._threads.close()
        for proc in idle:
            self._retire(proc)

    # --------------------------------------------------------------- one job

    def _run(
        self,
        request: dict[str, Any],
        timeout: float | None,
        stop: runner.Stop,
        on_line: Callable[[str], None] | None,
        key: object,
    ) -> ResidentResult:
        kind = str(request["kind"])
        try:
            proc = self._take(kind, stop)
        except OSError as exc:
            self._failed(kind)
            what = f"cannot start the resident handler of {kind}: {exc.strerror or exc}"
            return ResidentResult(runner.Outcome(start_error=what))
        if proc is None:  # stopped while waiting to start one
            return ResidentResult(runner.Outcome(stopped=True, stop_reason=stop.reason))
        try:
            self._on_started(key, proc.pid)
            # The job's time starts once its process is there, after any restart pause.
            started = time.monotonic()
            deadline = None if timeout is None else time.time() + timeout
            line = json.dumps({"v": PROTOCOL, **request, "deadline": deadline}, default=str)
            stderr = runner.KeptStream(self._keep)  # what is kept of it, as for a job's process
            result, keep_process = self._exchange(
                proc, line, request["id"], started, timeout, stop, stderr, on_line
            )
        except Exception:
            self._kill(proc)  # in an unknown state: no other job may get it
            raise
        if keep_process:
            self._give_back(kind, proc)
        return result

    def _exchange(
        self,
        proc: _Process,
        line: str,
        job_id: int,
        started: float,
        timeout: float | None,
        stop: runner.Stop,
        stderr: runner.KeptStream,
        on_line: Callable[[str], None] | None,
    ) -> tuple[ResidentResult, bool]:
        """Send the job, read until its result; (the result, whether the
        process may serve another job)."""
        kind = proc.kind

        def ended(**fields: Any) -> runner.Outcome:
            kept = stderr.output()
            return runner.Outcome(
                duration=time.monotonic() - started,
                timeout=timeout,
                stderr=kept,
                output_tail=(kept.tail or kept.head)[-runner.TAIL_BYTES :],
                output_bytes=stderr.total,
                **fields,
            )

        assert proc.proc.stdin is not None and proc.proc.stdout is not None
        assert proc.proc.stderr is not None
        # The line goes out as the handler reads it, in the same wait as its
        # answer: one that does not read is stopped by the timeout or a stop
        # like one that does not answer (a line is up to the payload's size).
        outgoing = memoryview(line.encode() + b"\n")
        in_fd = proc.proc.stdin.fileno()
        os.set_blocking(in_fd, False)
        out_fd, err_fd = proc.proc.stdout.fileno(), proc.proc.stderr.fileno()
        partial = b""
        buffered = proc.pending
        proc.pending = b""
        while True:
            if b"\n" in buffered:
                answer, _, rest = buffered.partition(b"\n")
                self._drain(err_fd, stderr, on_line, partial)
                result = self._judge(answer, job_id, ended)
                if result is None:
                    self._kill(proc)
                    self._failed(kind)
                    shown = answer[:200].decode("utf-8", "replace")
                    error = (
                        f"the resident handler answered what is not job {job_id}'s "
                        f"result: {shown!r}"
                    )
                    return ResidentResult(ended(error=error)), False
                proc.pending = rest
                proc.jobs += 1
                self._answered(kind)
                spent = self._max_jobs is not None and proc.jobs >= self._max_jobs
                if spent:
                    self._retire(proc)
                return result, not spent
            if len(buffered) > MAX_RESULT_BYTES:
                self._kill(proc)
                self._failed(kind)
                error = (
                    f"the resident handler wrote over {MAX_RESULT_BYTES} bytes "
                    "without a result line"
                )
                return ResidentResult(ended(error=error)), False
            if stop.requested:
                self._kill(proc)
                return ResidentResult(ended(stopped=True, stop_reason=stop.reason)), False
            left = None if timeout is None else started + timeout - time.monotonic()
            if left is not None and left <= 0:
                self._kill(proc)
                return ResidentResult(ended(timed_out=True)), False
            wait = TICK if left is None else min(TICK, left)
            writing = [in_fd] if outgoing else []
            ready, can_write, _ = select.select([out_fd, err_fd], writing, [], wait)
            if can_write:
                try:
                    outgoing = outgoing[os.write(in_fd, outgoing[:65536]) :]
                except BlockingIOError:
                    pass
                except BrokenPipeError:
                    outgoing = memoryview(b"")  # it exited: its stdout ends next
            if err_fd in ready:
                partial = self._read_err(err_fd, stderr, on_line, partial)
            if out_fd in ready:
                chunk = os.read(out_fd, 65536)
                if not chunk:  # it exited without answering
                    self._drain(err_fd, stderr, on_line, partial)
                    self._reap(proc)
                    self._failed(kind)
                    error = (
                        f"the resident handler exited ({proc.exit_text()}) before answering "
                        f"for job {job_id}"
                    )
                    return ResidentResult(ended(error=error)), False
                buffered += chunk

    @staticmethod
    def _judge(
        answer: bytes, job_id: int, ended: Callable[..., runner.Outcome]
    ) -> ResidentResult | None:
        """The result a line says, or None when it is not this job's."""
        try:
            said = json.loads(answer)
        except ValueError:
            return None
        if not isinstance(said, dict) or said.get("id") != job_id:
            return None
        status = said.get("status")
        error = str(said.get("error") or "")[:ERROR_CHARS]
        if status == "done":
            return ResidentResult(ended(exit_code=0))
        if status == "failed":
            return ResidentResult(ended(error=error or "the resident handler said it failed"))
        if status == "retry":
            after = said.get("after")
            if not isinstance(after, (int, float)) or isinstance(after, bool) or after < 0:
                return None
            said_error = error or f"the resident handler asked for a retry in {after}s"
            return ResidentResult(ended(error=said_error), retry_after=float(after))
        return None

    def _read_err(
        self,
        fd: int,
        stderr: runner.KeptStream,
        on_line: Callable[[str], None] | None,
        partial: bytes,
    ) -> bytes:
        chunk = os.read(fd, 65536)
        if not chunk:
            return partial
        stderr.keep(chunk)
        if on_line is None:
            return b""
        *lines, partial = (partial + chunk).split(b"\n")
        for one in lines:
            on_line(one.decode("utf-8", "replace"))
        return partial

    def _drain(
        self,
        fd: int,
        stderr: runner.KeptStream,
        on_line: Callable[[str], None] | None,
        partial: bytes,
    ) -> None:
        """What the job wrote to stderr before its result, read to the end."""
        while select.select([fd], [], [], 0)[0]:
            before = stderr.total
            partial = self._read_err(fd, stderr, on_line, partial)
            if stderr.total == before:
                break
        if partial and on_line is not None:
            on_line(partial.decode("utf-8", "replace"))

    # ------------------------------------------------------------ processes

    def _take(self, kind: str, stop: runner.Stop) -> _Process | None:
        """An idle process of `kind`, or a new one once its restart pause
        is over; None when stopped first."""
        with self._lock:
            if self._idle[kind]:
                return self._idle[kind].pop()
            start_at = self._restart_at[kind]
        while time.monotonic() < start_at:
            if stop.wait(min(TICK, start_at - time.monotonic())):
                return None
        if stop.requested:
            return None
        proc = _Process(kind, self.serve[kind], self.env)
        if self._guard is not None:
            self._guard.started(proc.pid)
        return proc

    def _give_back(self, kind: str, proc: _Process) -> None:
        with self._lock:
            if not self._closed:
                self._idle[kind].append(proc)
                return
        self._retire(proc)

    def _answered(self, kind: str) -> None:
        with self._lock:
            self._failures[kind] = 0
            self._restart_at[kind] = 0.0

    def _failed(self, kind: str) -> None:
        """A process of `kind` failed: the next one starts after a pause."""
        with self._lock:
            self._failures[kind] += 1
            pause = min(RESTART_FIRST * 2 ** (self._failures[kind] - 1), RESTART_CAP)
            self._restart_at[kind] = time.monotonic() + pause

    def _kill(self, proc: _Process) -> None:
        """Its whole group: SIGTERM, then SIGKILL after the grace."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.proc.wait(self._term_grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._reap(proc)

    def _retire(self, proc: _Process) -> None:
        """No more jobs: its stdin closed, it exits (or is killed)."""
        if proc.proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.proc.stdin.close()
        try:
            proc.proc.wait(RETIRE_GRACE)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            return
        self._reap(proc)

    def _reap(self, proc: _Process) -> None:
        if self._guard is not None:
            self._guard.ended(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.proc.wait(self._term_grace)
        for stream in (proc.proc.stdin, proc.proc.stdout, proc.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
