"""One command run to its end on the calling thread, and a job's whole environment.

The worker runs its children through `runner.Supervisor` and filters its
environment once; tests and benchmarks want one child at a time and one call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from pgqctl.payload import job_environment, without_credentials
from pgqctl.runner import NO_CAP, Command, Outcome, OutputCap, Stop, _ended_before_start, _Reactor


def run(
    command: Command,
    env: Mapping[str, str],
    *,
    stop: Stop | None = None,
    term_grace: float = 5.0,
    on_line: Callable[[str], None] | None = None,
    cap: OutputCap = NO_CAP,
) -> Outcome:
    """Run `command` to the end and say how it ended. Blocks; never raises for
    the child's sake.

    `stop`: another thread's `Stop.request` ends the child (SIGTERM to its
    group, SIGKILL after `term_grace`); if already requested, nothing starts.
    `on_line` gets each complete output line, decoded as UTF-8 with
    replacement characters and without its newline (a final unterminated line
    too; a line over `MAX_LINE_BYTES` in pieces). It runs on this thread; if
    it raises, the child's group is killed and the exception propagates.
    `cap`: how much of the output `on_line` gets.
    """
    started = time.monotonic()
    ended = _ended_before_start(command, stop)
    if ended is not None:
        return ended
    with _Reactor(term_grace) as reactor:
        child = reactor.start(command, env, stop=stop, on_line=on_line, started=started, cap=cap)
        while not child.complete:
            reactor.step()
        outcome = reactor.finish(child)
    if child.error is not None:
        raise child.error
    return outcome


def child_environment(
    base: Mapping[str, str],
    *,
    job_id: int,
    kind: str,
    queue: str,
    attempt: int,
    extra: Mapping[str, str],
) -> dict[str, str]:
    """The child's environment: `base` without database credentials, then the
    job's `extra`, then PGQCTL_JOB_* (which the job's env cannot override)."""
    return job_environment(
        without_credentials(base),
        job_id=job_id,
        kind=kind,
        queue=queue,
        attempt=attempt,
        extra=extra,
    )
