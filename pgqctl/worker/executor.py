"""Where a claimed job runs: a child process (`runner.Supervisor`, watched
by the guard that stops jobs if this worker dies), for a kind given to
--sql, a statement on a connection of its own (`sql_jobs.SqlJobs`), or, for
a kind given to --serve, a line to a process kept running
(`resident.ResidentJobs`).

The executor turns a claimed job into what runs it and hands it on; each
job's end comes back as one `Finished`, put on the loop's event queue by
whichever thread saw it. It never touches the loop's connection, and never
calls back into the loop: it is given the two ways to post an event.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from pgqctl import db, payload, resident, runner, sql_jobs
from pgqctl.guard import Guard
from pgqctl.rows import Unreadable
from pgqctl.worker.config import TERM_GRACE, WorkerConfig, output_keep
from pgqctl.worker.narration import Narration
from pgqctl.worker.outbox import Finished
from pgqctl.worker.slots import Running


class Executor:
    def __init__(
        self,
        config: WorkerConfig,
        connect: Callable[[], db.QueueConnection],
        environ: Mapping[str, str],
        say: Narration,
        *,
        put: Callable[[object], None],
        post: Callable[[object], None],
    ) -> None:
        self.config = config
        self.environ = environ
        self.say = say
        # `put` queues an event from the thread that watches the children
        # (the loop's own wait returns after it); `post` also wakes that
        # wait, for events from any other thread.
        self._put = put
        self._post = post
        self.output_cap = runner.OutputCap(config.log_output_lines, config.log_output_bytes)
        self.output_keep = output_keep(config)
        self.guard: Guard | None = None
        self.children: runner.Supervisor | None = None
        self.sql = (
            sql_jobs.SqlJobs(
                dict(config.sql_handlers),
                connect,
                on_started=self._sql_started,
                on_done=self._sql_done,
                keep=config.concurrency,
            )
            if config.sql_handlers
            else None
        )
        self.resident: resident.ResidentJobs | None = None
        self._guard_lost_said = False

    def check(self, conn: db.QueueConnection) -> None:
        """Refuse to start (BadInput) with what no job could ever run: a
        --sql statement the server cannot prepare, or of the wrong parameters."""
        if self.sql is not None:
            self.sql.check(conn)

    def start(self) -> None:
        try:
            self.guard = Guard(TERM_GRACE, self.say.log.format, self.environ)
        except OSError as exc:
            self.say.error("cannot start the guard that stops jobs if this worker dies", exc)
        self.children = runner.Supervisor(
            self._child_done,
            on_start=self._child_started,
            term_grace=TERM_GRACE,
            guard=self.guard,
        )
        if self.config.serve:
            self.resident = resident.ResidentJobs(
                dict(self.config.serve),
                {**self.environ, "PGQCTL_JOB_SCHEMA": self.config.schema},
                on_started=self._child_started,
                on_done=self._resident_done,
                guard=self.guard,
                term_grace=TERM_GRACE,
                max_jobs_per_process=self.config.max_jobs_per_process,
                keep=self.output_keep,
            )

    def close(self) -> None:
        """Stop watching (after the loop stopped its jobs) and let go of the
        SQL jobs' connections."""
        if self.children is not None:
            self.children.close(timeout=TERM_GRACE + 1)
        if self.resident is not None:
            self.resident.close()
        if self.guard is not None:
            self.guard.close(timeout=TERM_GRACE + 1)
        if self.sql is not None:
            self.sql.close()

    def wake(self) -> None:
        """Return from `drive` now (an event arrived from another thread)."""
        if self.children is not None:
            self.children.wake()

    def drive(self, timeout: float) -> None:
        """Watch the children (output, timeouts, exits) for up to `timeout` seconds."""
        assert self.children is not None
        self.children.drive(timeout)

    def failure(self) -> BaseException | None:
        """Why the thread running children failed, if it did (each job it
        held was reported failed)."""
        return None if self.children is None else self.children.failure

    def say_guard_lost(self) -> None:
        """Say once that the guard is gone (a job may outlive a killed worker)."""
        if self.guard is not None and self.guard.lost and not self._guard_lost_said:
            self._guard_lost_said = True
            self.say.guard_lost(self.guard.pid)

    def launch(self, running: Running) -> None:
        """Start a claimed job; a payload that can never run, or a failure to
        prepare it, ends the job at once."""
        job = running.job
        c = self.config
        try:
            if isinstance(job.payload, Unreadable):  # what its row holds can never run
                raise payload.PayloadRejected(job.payload.reason)
            if self.sql is not None and job.kind in self.sql:
                self.sql.submit(
                    running,
                    job_id=job.id,
                    attempt=job.attempts,
                    kind=job.kind,
                    payload=json.dumps(job.payload),
                    timeout=c.timeout,
                    stop=running.stop,
                )
                return
            if self.resident is not None and job.kind in self.resident:
                self.resident.submit(
                    running,
                    request={
                        "id": job.id,
                        "attempt": job.tries,
                        "claim": job.attempts,
                        "kind": job.kind,
                        "queue": job.queue,
                        "payload": job.payload,
                    },
                    timeout=c.timeout,  # the payload is the handler's, as for --handler
                    stop=running.stop,
                    on_line=self.say.forwarder(job.id),
                )
                return
            command = payload.command_for_job(
                job.payload,
                kind=job.kind,
                handlers=c.handler_map,
                allow_shell=c.allow_shell,
                default_timeout=c.timeout,
                policy=c.policy,
                environ=self.environ,
            )
            env = payload.job_environment(
                self.environ,
                job_id=job.id,
                kind=job.kind,
                queue=job.queue,
                attempt=job.tries,
                extra=command.env,
                claim=job.attempts,
                schema=c.schema,
                schedule=job.schedule,
                tick=job.tick,
            )
            assert self.children is not None
            self.children.submit(
                running,
                command,
                env,
                stop=running.stop,
                on_line=self.say.forwarder(job.id),
                cap=self.output_cap,
                keep=self.output_keep,
            )
        except payload.PayloadRejected as exc:
            self._put(Finished(running, runner.Outcome(start_error=exc.reason), exc.reason))
        except Exception as exc:  # never lose the job's report
            self._child_done(running, runner.Outcome(), exc)

    def _child_started(self, key: object, pid: int) -> None:
        """A job's process exists (called on whichever thread started it)."""
        assert isinstance(key, Running)
        self.say.started(key, pid=pid)

    def _sql_started(self, key: object, backend_pid: int) -> None:
        """A SQL job's statement is about to run (called on its thread)."""
        assert isinstance(key, Running)
        self.say.started(key, backend_pid=backend_pid)

    def _sql_done(self, key: object, result: sql_jobs.SqlResult) -> None:
        """A SQL job ended (called on its thread): post its result, waking the loop."""
        assert isinstance(key, Running)
        self._post(
            Finished(key, result.outcome, committed=result.committed, fenced_out=result.fenced_out)
        )

    def _resident_done(self, key: object, result: resident.ResidentResult) -> None:
        """A resident handler's job ended (called on its thread): post it, waking the loop."""
        assert isinstance(key, Running)
        self._post(Finished(key, result.outcome, retry_after=result.retry_after))

    def _child_done(
        self, key: object, outcome: runner.Outcome, error: BaseException | None
    ) -> None:
        """A child ended (called on whichever thread watches the children): post its result."""
        assert isinstance(key, Running)
        if error is not None:
            self.say.error(f"job {key.job.id}: unexpected error running it", error)
            outcome = runner.Outcome(start_error=f"worker error: {error}")
        elif outcome.left_out_bytes or outcome.left_out_lines:
            self.say.output_left_out(key.job.id, outcome)
        self._put(Finished(key, outcome))
