"""The process engine: run commands as child processes, many at once.

No database here, no printing, no exiting, and no reading of payloads (that
is ``payload.py``, which turns a job into a `Command`): the worker
(``pgqctl/worker/``) hands each job's `Command` to a `Supervisor` and decides
what each `Outcome` means.

- `Supervisor` starts each child, feeds its stdin, reads its stdout and
  its stderr (each from a pipe of its own), enforces the timeout, honours a
  `Stop` request from another thread, and reports each child's `Outcome`
  (how it ended, what it wrote, the CPU and memory it used) to a callback,
  for any number of children at once, watched from one thread (its own, or
  its caller's while it calls `drive`). It never raises for anything a child
  does, including failing to start.
- `open_files_needed` says how many open files that many children take.

Processes and signals. Each child leads a session and process group of its
own (``start_new_session``), so a Ctrl-C on the worker's terminal, or a
signal sent to the worker's process group, reaches the worker only: the
worker decides what happens to running jobs (claim nothing more, let them
finish for ``--grace``, then `Stop.request` each one). Stopping a child, or
timing it out, sends SIGTERM to its whole process group and SIGKILL to the
group ``term_grace`` seconds later if the child or anything holding its
output is still there; grandchildren die with it. Processes that leave the
group (``setsid``, a shell with job control) escape both. When a child
exits on its own, whatever it left running in the background is not
killed; its output is read for a moment more (`DRAIN_AFTER_EXIT`), then no
longer waited for.

If the worker itself is SIGKILLed, its children keep running (they get
SIGPIPE the next time they write output) and the job's lease expires, so
the job may run again: PGQCTL_JOB_ID is the idempotency key.

Costs. Children start with ``posix_spawn`` (with ``Popen`` for a job with a
``cwd``, which posix_spawn cannot set). The supervisor uses one thread for
all its children (or its caller's, see `Supervisor.drive`) and never
sleeps to poll: it blocks in one ``poll()`` on the output pipes (two per
child: stdout and stderr), the stdin pipes, a pidfd for each child's exit
(Linux 5.3+; elsewhere it checks every 50 ms) and an eventfd for `Stop`
requests and new children, with the nearest deadline as timeout. Output is
not kept beyond a tail of `TAIL_BYTES` bytes of both streams together and,
for each stream, the head and tail its `OutputKeep` asks for: a child
writing gigabytes costs reads, not memory. A child is reaped with
``wait4``, which gives its CPU time and peak memory for free. POSIX only.

Two pipes cannot say in which order a child wrote to stdout and stderr.
`Outcome.output_tail` (both streams together) appends what is read in the
order it is read: writes seen in different turns of the loop keep their
order; what both pipes hold at once (a child writing to both faster than
the worker reads, or just before it exits) comes stdout first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import math
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

# Bytes of output kept for `Outcome.output_tail`.
TAIL_BYTES = 4096
# Characters of output `Outcome.last_error` includes by default.
LAST_ERROR_CHARS = 2000
# A line longer than this reaches `on_line` in pieces of this size.
MAX_LINE_BYTES = 16384
# After a child exits on its own, seconds to keep reading output that
# background processes it left behind may still be writing.
DRAIN_AFTER_EXIT = 0.1
# Without pidfds (not Linux, or Linux < 5.3), how often to check whether a
# child that closed its output has exited.
_EXIT_POLL_SECONDS = 0.05

# Descriptors a running child holds open in its parent, at most: its stdout
# and stderr pipes, its pidfd, and its stdin pipe until all of its stdin is
# written.
_FDS_PER_CHILD = 4
# What a process running children needs besides: standard streams, wake-up
# pipes, database connections, a child's pipe ends while it starts, Python's
# own; with room to spare.
_FDS_BESIDES = 32


def open_files_needed(children: int) -> int:
    """Open files a process needs to run this many children at once."""
    return children * _FDS_PER_CHILD + _FDS_BESIDES


# The longest one wait in the children's poll() may last.
_MAX_POLL_MS = 60_000
_READ_SIZE = 65536
# Output read from one child per turn of the poll loop while its lines go to
# `on_line` (a log line each, in the worker): every line of it is handed
# over before the loop turns again, so a child printing as fast as it can
# gets no more than this much attention before the others are looked at.
# Output nobody takes line by line (past the `OutputCap`) is only counted and
# kept: once a stream of it fills a read, its pipe grows to `_BULK_PIPE_SIZE`
# (where the system allows) and is read `_BULK_READ_SIZE` at a time, so that
# a child writing a lot is not held up, while one writing little (most jobs)
# costs no more than a small read.
_OUTPUT_READ_SIZE = 4096
_BULK_READ_SIZE = 256 * 1024
_BULK_PIPE_SIZE = 1 << 20
_F_SETPIPE_SZ: int | None = getattr(fcntl, "F_SETPIPE_SZ", None)
# ru_maxrss is in KiB on Linux and the BSDs, in bytes on macOS.
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


def own_peak_memory() -> int:
    """This process's peak resident memory, in bytes: where the kernel starts
    counting a child's (see Outcome)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _MAXRSS_UNIT


_pidfd_open: Callable[[int], int] | None = getattr(os, "pidfd_open", None)
# Linux: one eventfd is cheaper than a pipe as a wake-up for `Stop`.
_eventfd: Callable[[int, int], int] | None = getattr(os, "eventfd", None)
_EVENTFD_FLAGS = getattr(os, "EFD_CLOEXEC", 0) | getattr(os, "EFD_NONBLOCK", 0)
_posix_spawn: Callable[..., int] | None = getattr(os, "posix_spawn", None)
# Signals Python ignores and a child must get back at their default, as
# Popen's restore_signals does: a child writing to a closed pipe should die of
# SIGPIPE, not loop on EPIPE.
_RESTORED_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name)
)
# What `Stop` writes to wake a waiter: an eventfd takes exactly 8 bytes.
_ONE = (1).to_bytes(8, sys.byteorder)


@dataclass(frozen=True)
class Command:
    """What to run for one job.

    `env` holds only the job's own variables (`payload.job_environment` merges
    them into the child's whole environment). `stdin` None means /dev/null.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    stdin: bytes | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class OutputCap:
    """How much of a child's output reaches `on_line`: its first `lines`
    lines (a piece of a long line counts as one), holding at most `bytes`
    bytes together, newlines included. The rest is only read and counted
    (`Outcome.left_out_bytes`, `left_out_lines`)."""

    lines: int
    bytes: int


NO_CAP = OutputCap(sys.maxsize, sys.maxsize)


@dataclass(frozen=True)
class OutputKeep:
    """How much of each of a child's streams (stdout and stderr, each on its
    own) its `Outcome` keeps: the first `head_bytes` and the last
    `tail_bytes`. 0 keeps nothing of that end; every byte is counted all the
    same. A child holds at most head_bytes + tail_bytes of each stream in
    memory, however much it writes."""

    head_bytes: int
    tail_bytes: int


NO_KEEP = OutputKeep(0, 0)


@dataclass(frozen=True)
class StreamOutput:
    """What a child wrote to one stream, as far as its `OutputKeep` kept it.

    `total_bytes`: all it wrote. If that is no more than head_bytes +
    tail_bytes, `head` holds all of it and `tail` is empty (a short output
    is stored once, and decoded in one piece), and `omitted_bytes` is 0.
    Otherwise `head` is its first head_bytes, `tail` its last tail_bytes,
    and `omitted_bytes` the bytes between them, left out. Decoded as UTF-8
    with replacement characters: a character cut by the gap is one U+FFFD at
    the end of `head` or the start of `tail`.
    """

    head: str = ""
    tail: str = ""
    total_bytes: int = 0
    omitted_bytes: int = 0


_NO_OUTPUT = StreamOutput()


@dataclass(frozen=True)
class Outcome:
    """How a child ended.

    Exactly one of these explains the end: `start_error` (never started),
    `timed_out`, `stopped` (a `Stop` was requested), `signal` (died of a
    signal on its own) or `exit_code`. `exit_code` and `signal` also say how
    a timed-out or stopped child finally ended. `output_tail` is the end of
    stdout and stderr together, as read (see the module's notes on order);
    `output_bytes` counts all of it. `stdout` and `stderr`: each stream on
    its own, its head and tail as the submission's `OutputKeep` asked.
    `never_starts`: the start error comes from the command itself (no such
    program, arguments over the system's limit), so trying again cannot help.
    `left_out_bytes` and `left_out_lines`: the output `on_line` did not get
    (past its `OutputCap`); a line counts when any of it was left out.

    `cpu_user` and `cpu_system` (seconds) and `max_rss_bytes` (peak resident
    memory), as the kernel reports them when the child is reaped: they
    cover the child and those of its descendants it waited for itself, not
    the ones it left running or that died with its group after it; the peak
    is the largest of any one of them, not their sum. Linux starts a child's
    peak at the peak of the process it was started from (the worker, or
    whatever runs the supervisor), so only a peak above that one is the
    job's own. None when no child ran.
    """

    exit_code: int | None = None
    signal: int | None = None
    timed_out: bool = False
    stopped: bool = False
    stop_reason: str | None = None
    start_error: str | None = None
    never_starts: bool = False
    output_tail: str = ""
    output_bytes: int = 0
    stdout: StreamOutput = _NO_OUTPUT
    stderr: StreamOutput = _NO_OUTPUT
    left_out_bytes: int = 0
    left_out_lines: int = 0
    duration: float = 0.0
    timeout: float | None = None
    # The job's own error when it ran no child (a SQL handler's statement).
    error: str | None = None
    cpu_user: float | None = None
    cpu_system: float | None = None
    max_rss_bytes: int | None = None

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.stopped

    def describe(self) -> str:
        """One line for logs and the first line of `last_error`."""
        if self.start_error is not None:
            return self.start_error
        if self.error is not None:
            return self.error
        if self.timed_out:
            text = f"timed out after {_seconds(self.timeout or self.duration)}"
            if self.signal == signal.SIGKILL:
                text += " (still running after SIGTERM, killed)"
            return text
        if self.stopped:
            if self.exit_code is None and self.signal is None:
                return f"stopped before start: {self.stop_reason}"
            return f"stopped: {self.stop_reason}"
        if self.signal is not None:
            return f"killed by signal {self.signal} ({_signal_name(self.signal)})"
        return f"exit status {self.exit_code}"

    def last_error(self, limit: int = LAST_ERROR_CHARS) -> str:
        """`describe()`, then at most `limit` characters of the output's end."""
        tail = self.output_tail.rstrip("\n")
        if not tail or limit <= 0:
            return self.describe()
        if len(tail) > limit or self.output_bytes > TAIL_BYTES:
            shown = min(len(tail), limit)
            note = f"[output truncated: last {shown} characters of {self.output_bytes} bytes]"
            return f"{self.describe()}\n{note}\n{tail[-limit:]}"
        return f"{self.describe()}\n{tail}"


class Stop:
    """A request, from any thread, that running children stop.

    One-shot: the first `request` wins and later ones change nothing. One
    `Stop` may serve one job (lease lost) or many at once (shutdown). It holds
    no OS resources: whoever waits on children (each `Supervisor`) subscribes
    a wake-up fd of its own.
    """

    def __init__(self) -> None:
        # Reentrant, in case a signal handler on the main thread requests a
        # stop while that thread is inside `_subscribe`.
        self._lock = threading.RLock()
        self._reason: str | None = None
        self._wakeups: set[int] = set()
        self._event: threading.Event | None = None  # made by the first `wait`
        self._callbacks: list[Callable[[], None]] = []

    def request(self, reason: str = "stop requested") -> bool:
        """Ask for a stop; True if this call was the first to ask."""
        with self._lock:
            if self._reason is not None:
                return False
            self._reason = reason
            if self._event is not None:
                self._event.set()
            for fd in self._wakeups:
                _poke(fd)
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
        return True

    def when_requested(self, callback: Callable[[], None]) -> None:
        """Call `callback` (once, on the requesting thread) when a stop is
        requested; at once if one was. For work that is not a child: a SQL
        job cancels its statement."""
        with self._lock:
            if self._reason is None:
                self._callbacks.append(callback)
                return
        callback()

    @property
    def requested(self) -> bool:
        return self._reason is not None

    @property
    def reason(self) -> str | None:
        return self._reason

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop is requested or `timeout` passes; True if requested."""
        with self._lock:
            if self._reason is not None:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def _subscribe(self, fd: int) -> None:
        with self._lock:
            self._wakeups.add(fd)
            if self._reason is not None:
                _poke(fd)

    def _unsubscribe(self, fd: int) -> None:
        with self._lock:
            self._wakeups.discard(fd)


class GroupTracker(Protocol):
    """Told which children's process groups exist (pgqctl.guard.Guard)."""

    def started(self, pgid: int) -> None: ...

    def ended(self, *pgids: int) -> None: ...


class Supervisor:
    """Runs many children at once, watched from one thread at a time.

    `submit` hands a command over from any thread and returns at once; when
    the child has ended, `on_done(key, outcome, error)` is called, with
    `error` set when `on_line` raised (the child's group was killed then) or
    when watching the child failed in some unforeseen way: every submission
    gets exactly one call. `on_start(key, pid)`, if given, is called once the
    child's process exists (not for a child that could not start), before
    any of its output. `guard`, if given, is told of each child's process
    group as it starts and just before the child is reaped.

    By default the supervisor's own thread watches the children. A caller
    with a loop of its own (the worker) may watch them itself instead, by
    calling `drive` where it would otherwise wait: children then start and
    end on the caller's thread, with no thread switch per job, which costs a
    busy worker more than the children themselves. While the caller is away
    from `drive` for longer than `STANDBY` seconds (a slow statement, a
    reconnect), the supervisor's thread stands in, so a timeout or a job's
    output never waits on the caller; it hands back as soon as the caller
    drives again. Whoever holds `_baton` is the only one touching the
    children.
    """

    STANDBY = 0.1

    def __init__(
        self,
        on_done: Callable[[object, Outcome, BaseException | None], None],
        *,
        on_start: Callable[[object, int], None] | None = None,
        term_grace: float = 5.0,
        guard: GroupTracker | None = None,
        name: str = "pgqctl-children",
    ) -> None:
        self._on_done = on_done
        self._on_start = on_start
        self._reactor = _Reactor(term_grace, guard)
        # Submissions not yet taken (None: close). The driver is woken once
        # per batch of them, not once per child.
        self._inbox: list[_Submission | None] = []
        # Reentrant: `wake` may come from a signal handler that interrupted
        # this very thread while it held the lock.
        self._inbox_lock = threading.RLock()
        self._woken = False
        # Set (under the lock) when the children are no longer watched, by
        # close or by an unforeseen error, which `failure` then holds.
        self._ended = False
        self.failure: BaseException | None = None
        self._baton = threading.Lock()
        self._guest: int | None = None  # the thread that drives, once one does
        self._guest_inside = False
        self._guest_left = 0.0  # when it last left `drive`
        self._want_back = False
        # A wake the stand-in read while the caller was away: it was meant for
        # the caller (an event on its queue), whose next drive returns at once.
        self._missed_wake = False
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(
        self,
        key: object,
        command: Command,
        env: Mapping[str, str],
        *,
        stop: Stop | None = None,
        on_line: Callable[[str], None] | None = None,
        cap: OutputCap = NO_CAP,
        keep: OutputKeep = NO_KEEP,
    ) -> None:
        """Start `command` soon; `on_done(key, ...)` says how it ended.

        `stop`: another thread's `Stop.request` ends the child (SIGTERM to its
        group, SIGKILL after `term_grace`); if already requested, nothing
        starts. `on_line` gets each complete output line, decoded as UTF-8
        with replacement characters and without its newline (a final
        unterminated line too; a line over `MAX_LINE_BYTES` in pieces), on
        the thread watching the children; if it raises, the child's group is
        killed and `on_done` gets the exception. Lines are cut per stream
        (a line on stderr never splits one on stdout). `cap`: how much of
        the output `on_line` gets, both streams together; the rest is read as
        fast as it comes, and counted. `keep`: how much of each stream the
        outcome's `stdout` and `stderr` hold (by default nothing, only
        counts).
        """
        submission = _Submission(key, command, env, stop, on_line, cap, time.monotonic(), keep)
        if threading.get_ident() == self._guest and self._baton.acquire(blocking=False):
            # The driving thread, between two turns: start it now.
            try:
                if not self._ended:
                    self._start(submission)
                    return
            finally:
                self._baton.release()
        self._post(submission)

    def drive(self, timeout: float) -> None:
        """Watch the children from this thread for up to `timeout` seconds,
        or until something happens (a child ends, `wake`); call it in a loop."""
        self._guest = threading.get_ident()
        self._guest_inside = True
        self._want_back = True
        try:
            if not self._baton.acquire(blocking=False):
                self.wake()  # the stand-in is in poll(): hand back
                self._baton.acquire()
            try:
                self._want_back = False
                missed, self._missed_wake = self._missed_wake, False
                if self._ended:
                    time.sleep(min(max(timeout, 0.0), self.STANDBY))
                    return
                self._turn(0.0 if missed else timeout)
            except Exception as exc:
                self._fail(exc)
            finally:
                self._baton.release()
        finally:
            self._guest_inside = False
            self._guest_left = time.monotonic()

    def wake(self) -> None:
        """Make a `drive` in progress return now (from any thread, or a signal handler)."""
        with self._inbox_lock:
            if not self._ended:
                self._reactor.wake()  # under the lock: the fd is open

    def close(self, timeout: float | None = None) -> None:
        """Stop watching; children still running are killed and reaped,
        without `on_done` calls."""
        self._closing.set()
        self._post(None)
        self._thread.join(timeout)

    def _post(self, item: _Submission | None) -> None:
        with self._inbox_lock:
            if not self._ended:
                self._inbox.append(item)
                if not self._woken:
                    self._woken = True
                    self._reactor.wake()  # under the lock: the fd is open
                return
        if item is not None:  # no longer watching: say so at once
            self._on_done(item.key, Outcome(), self.failure)

    def _take(self) -> list[_Submission | None]:
        with self._inbox_lock:
            items, self._inbox, self._woken = self._inbox, [], False
        return items

    def _serve(self) -> None:
        try:
            while self._stand_by():
                with self._baton:
                    if self._ended:
                        return
                    while self._turn(self.STANDBY if self._guest else None):
                        if self._guest and self._want_back and not self._closing.is_set():
                            break
                    else:
                        self._end(None)
                        return
        except Exception as exc:
            with self._baton:
                self._fail(exc)

    def _stand_by(self) -> bool:
        """Wait until the children need this thread: always while no caller
        drives; otherwise once the caller has been away for STANDBY seconds,
        or to close. False once they are no longer watched."""
        while not self._ended:
            if self._guest is None or self._closing.is_set():
                return True
            if not self._guest_inside and time.monotonic() - self._guest_left >= self.STANDBY:
                return True
            self._closing.wait(self.STANDBY)
        return False

    def _turn(self, timeout: float | None) -> bool:
        """Start what was submitted, wait for the next event, report the
        children that ended; False once closed."""
        for submission in self._take():
            if submission is None:
                return False
            self._start(submission)
        reactor = self._reactor
        reactor.woken = False
        ended = reactor.step(timeout)
        if reactor.woken and self._guest is not None and threading.current_thread() is self._thread:
            self._missed_wake = True
        if ended:
            reactor.untrack(ended)
        for child in ended:
            try:
                outcome, error = reactor.finish(child), child.error
            except Exception as exc:  # never lose a child's report
                outcome, error = Outcome(), exc
            self._on_done(child.key, outcome, error)
        if ended and self._guest is not None and threading.current_thread() is self._thread:
            reactor.wake()  # standing in: the caller waits in poll() next, it should look
        return True

    def _fail(self, exc: BaseException) -> None:
        """Unforeseen (poll() itself failed?): every child is killed and
        reported, new ones are refused; `failure` says why. Holds the baton."""
        if not self._ended:
            self.failure = exc
            self._end(exc)

    def _end(self, failure: BaseException | None) -> None:
        orphans = list(self._reactor.children) if failure is not None else []
        # Ended before the reactor's wake-up fd closes, so that `_post`
        # never writes to it (or to whatever reuses its number) after.
        with self._inbox_lock:
            self._ended = True
            left, self._inbox = self._inbox, []
        self._reactor.close()  # kills and reaps what still runs
        self._closing.set()  # the stand-in stops waiting
        if failure is None:
            return
        for child in orphans:
            self._on_done(child.key, Outcome(), failure)
        for item in left:
            if item is not None:
                self._on_done(item.key, Outcome(), failure)

    def _start(self, s: _Submission) -> None:
        ended = _ended_before_start(s.command, s.stop)
        if ended is not None:
            self._on_done(s.key, ended, None)
            return
        try:
            child = self._reactor.start(
                s.command,
                s.env,
                stop=s.stop,
                on_line=s.on_line,
                cap=s.cap,
                keep=s.keep,
                started=s.started,
                key=s.key,
            )
        except Exception as exc:  # never lose a job's report
            self._on_done(s.key, Outcome(), exc)
            return
        if self._on_start is not None and child.start_error is None:
            try:
                self._on_start(s.key, child.pid)
            except Exception as exc:  # as when on_line raises: the child goes
                child.fail(exc)


class _Submission(NamedTuple):
    # A tuple: made per job, and cheaper than a frozen dataclass.
    key: object
    command: Command
    env: Mapping[str, str]
    stop: Stop | None
    on_line: Callable[[str], None] | None
    cap: OutputCap
    started: float
    keep: OutputKeep = NO_KEEP


def _ended_before_start(command: Command, stop: Stop | None) -> Outcome | None:
    if not command.argv:
        return Outcome(
            start_error="empty command: nothing to run", never_starts=True, timeout=command.timeout
        )
    if stop is not None and stop.requested:
        return Outcome(stopped=True, stop_reason=stop.reason, timeout=command.timeout)
    return None


class _Reactor:
    """Children of one thread: one poll() over all their fds and one wake-up fd.

    `step` waits for the next event or deadline of any child and returns the
    children that are complete; `finish` reaps one and says how it ended.
    Used from one thread only; `wake` (and `Stop.request`) may come from any.
    """

    def __init__(self, term_grace: float, guard: GroupTracker | None = None) -> None:
        self.term_grace = max(term_grace, 0.0)
        self.guard = guard
        self.poller = select.poll()
        self.owners: dict[int, _Child] = {}
        self.children: list[_Child] = []
        self.wake_fd, self.wake_w = _wakeup()
        self.woken = False  # whether the last step read a wake
        self.poller.register(self.wake_fd, select.POLLIN)
        # How many of our children each Stop serves: unsubscribe with the last.
        self.stops: dict[Stop, int] = {}

    def __enter__(self) -> _Reactor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill and reap every child still here; release the wake-up fd."""
        for child in self.children:
            child.abandon()
        for stop in self.stops:
            stop._unsubscribe(self.wake_w)
        self.children.clear()
        self.stops.clear()
        os.close(self.wake_fd)
        if self.wake_w != self.wake_fd:
            os.close(self.wake_w)

    def wake(self) -> None:
        _poke(self.wake_w)

    def start(
        self,
        command: Command,
        env: Mapping[str, str],
        *,
        stop: Stop | None,
        on_line: Callable[[str], None] | None,
        started: float,
        key: object = None,
        cap: OutputCap = NO_CAP,
        keep: OutputKeep = NO_KEEP,
    ) -> _Child:
        child = _Child(self, command, stop, on_line, started, key, cap, keep)
        try:
            child.start(env)
        except BaseException:
            child.abandon()  # whatever did start goes, and its fds
            raise
        self.children.append(child)
        if stop is not None and not child.complete:
            child.subscribed = True
            count = self.stops.get(stop, 0)
            self.stops[stop] = count + 1
            if not count:
                stop._subscribe(self.wake_w)  # pokes at once if already requested
        return child

    def finish(self, child: _Child) -> Outcome:
        self.children.remove(child)
        stop = child.stop
        if stop is not None and child.subscribed:
            self.stops[stop] -= 1
            if not self.stops[stop]:
                del self.stops[stop]
                stop._unsubscribe(self.wake_w)
        return child.finish()

    def untrack(self, children: list[_Child]) -> None:
        """Tell the guard, in one message, that these children's groups are
        about to be reaped (each is reaped only after)."""
        if self.guard is None:
            return
        groups = [c.pid for c in children if c.pid and c.returncode is None and c.tracked]
        if groups:
            self.guard.ended(*groups)
        for child in children:
            child.tracked = False

    def watch(self, fd: int, events: int, child: _Child) -> None:
        self.owners[fd] = child
        self.poller.register(fd, events)

    def forget(self, fd: int) -> None:
        if self.owners.pop(fd, None) is not None:
            self.poller.unregister(fd)

    def step(self, timeout: float | None = None) -> list[_Child]:
        """Wait for the next event or deadline (or `timeout` seconds at most);
        the children now complete."""
        now = time.monotonic()
        nearest = None if timeout is None else now + max(timeout, 0.0)
        complete = []
        for child in self.children:
            due = child.advance(now)
            if child.complete:
                complete.append(child)
            elif due is not None and (nearest is None or due < nearest):
                nearest = due
        if complete:
            return complete
        ms = -1 if nearest is None else max(0, math.ceil((nearest - now) * 1000))
        # A far deadline (a timeout of years) would overflow poll(): wake
        # now and then instead; advance() acts only once a deadline is due.
        for fd, _ in self.poller.poll(min(ms, _MAX_POLL_MS) if ms >= 0 else ms):
            if fd == self.wake_fd:
                self._woken()
                continue
            owner = self.owners.get(fd)
            if owner is not None:
                try:
                    owner.on_ready(fd)
                except Exception as exc:  # on_line raised
                    owner.fail(exc)
        now = time.monotonic()
        for child in self.children:
            child.advance(now)
        return [c for c in self.children if c.complete]

    def _woken(self) -> None:
        self.woken = True
        with contextlib.suppress(BlockingIOError):
            os.read(self.wake_fd, _READ_SIZE)
        for child in self.children:
            if child.stop is not None and child.stop.requested:
                child.request_stop()


class _Child:
    """One child process and what is known of it. Driven by its `_Reactor`."""

    # One per job: slots make it cheaper to make and to read.
    __slots__ = (
        "bytes_allowed",
        "capped",
        "command",
        "complete",
        "deadline",
        "drain_until",
        "ending",
        "error",
        "exited",
        "fds",
        "forwarded_bytes",
        "forwarded_lines",
        "in_fd",
        "key",
        "kill_at",
        "killed",
        "lines_allowed",
        "never_starts",
        "on_line",
        "output_bytes",
        "pending",
        "pid",
        "pidfd",
        "popen",
        "reactor",
        "returncode",
        "start_error",
        "started",
        "stderr",
        "stdout",
        "stop",
        "subscribed",
        "tail",
        "term_grace",
        "tracked",
        "usage",
    )

    def __init__(
        self,
        reactor: _Reactor,
        command: Command,
        stop: Stop | None,
        on_line: Callable[[str], None] | None,
        started: float,
        key: object,
        cap: OutputCap = NO_CAP,
        keep: OutputKeep = NO_KEEP,
    ) -> None:
        self.reactor = reactor
        self.command = command
        self.stop = stop
        self.on_line = on_line
        self.started = started
        self.key = key
        self.term_grace = reactor.term_grace
        self.deadline = None if command.timeout is None else started + command.timeout
        self.stdout = KeptStream(keep)
        self.stderr = KeptStream(keep)
        self.tail = bytearray()  # of both streams, in the order read
        self.output_bytes = 0
        # What `on_line` may still get, and what it got; once the cap is
        # reached (or with no `on_line`), output is only counted.
        self.lines_allowed = cap.lines if on_line is not None else 0
        self.bytes_allowed = cap.bytes
        self.forwarded_lines = 0  # whole lines, their newline included
        self.forwarded_bytes = 0
        self.capped = on_line is None
        self.fds: set[int] = set()  # every fd we own; closed at the end
        self.in_fd = -1
        self.pending = memoryview(b"")
        self.pidfd = -1
        self.pid = 0
        self.popen: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None  # set once reaped
        self.usage: resource.struct_rusage | None = None  # set once reaped
        self.exited = False
        self.ending: str | None = None  # "timeout" or "stop" once we end it
        self.kill_at: float | None = None
        self.killed = False
        self.drain_until: float | None = None
        self.complete = False  # nothing more to wait for: `finish` may reap it
        self.start_error: str | None = None
        self.never_starts = False
        self.error: BaseException | None = None  # raised by on_line
        self.subscribed = False  # counted in its reactor's `stops`
        self.tracked = False  # its group is listed with the guard

    # -- starting ---------------------------------------------------------------

    def start(self, env: Mapping[str, str]) -> None:
        try:
            self._spawn(env)
        except (OSError, ValueError) as exc:
            self._close_all()
            self.start_error = _start_error(exc, self.command, env)
            self.never_starts = _never_starts(exc, self.command)
            self.complete = True
            return
        if self.reactor.guard is not None:
            self.reactor.guard.started(self.pid)  # its group: pgid == pid
            self.tracked = True
        self._watch()

    def _spawn(self, env: Mapping[str, str]) -> None:
        # Every fd is made before the child starts, so running out of them is
        # a start error rather than an exception with a child running.
        self.stdout.fd, out_w = self._pipe()
        self.stderr.fd, err_w = self._pipe()
        stdin = _devnull()
        if self.command.stdin is not None:
            stdin, self.in_fd = self._pipe()
        try:
            self.pid = self._launch(env, stdin, out_w, err_w)
        finally:
            # The child has its copies; ours would keep the pipes open forever.
            self._close(out_w)
            self._close(err_w)
            if self.in_fd >= 0:
                self._close(stdin)

    def _launch(self, env: Mapping[str, str], stdin: int, out_w: int, err_w: int) -> int:
        if self.command.cwd is None and _posix_spawn is not None:
            # posix_spawn costs the worker about half of what Popen does per
            # child; it cannot change directory, so a job with a `cwd` goes
            # through Popen.
            return _spawn(self.command.argv, env, stdin, out_w, err_w)
        self.popen = subprocess.Popen(
            list(self.command.argv),
            stdin=stdin,
            stdout=out_w,
            stderr=err_w,
            cwd=self.command.cwd,
            env=env,
            start_new_session=True,
        )
        return self.popen.pid

    def _watch(self) -> None:
        # The output pipes stay blocking: each is read only after poll() says
        # it is readable (one fcntl pair fewer per job); `_drain` unblocks
        # them. stdout first: what both hold at once is read in that order.
        self.reactor.watch(self.stdout.fd, select.POLLIN, self)
        self.reactor.watch(self.stderr.fd, select.POLLIN, self)
        if self.in_fd >= 0:
            os.set_blocking(self.in_fd, False)
            self.pending = memoryview(self.command.stdin or b"")
            self._write()  # usually fits in the pipe at once
            if self.in_fd >= 0:
                self.reactor.watch(self.in_fd, select.POLLOUT, self)
        if _pidfd_open is not None:
            try:
                self.pidfd = _pidfd_open(self.pid)
            except OSError:  # old kernel or seccomp: fall back to polling
                self.pidfd = -1
            else:
                self.fds.add(self.pidfd)
                self.reactor.watch(self.pidfd, select.POLLIN, self)

    # -- running ----------------------------------------------------------------

    def fail(self, exc: Exception) -> None:
        """`on_line` (or the supervisor's `on_start`) raised: kill the group,
        and keep the exception for whoever finishes this child."""
        self.error = exc
        self._kill(signal.SIGKILL)
        self.killed = True
        self.complete = True

    def on_ready(self, fd: int) -> None:
        if fd == self.stdout.fd:
            self._read(self.stdout)
        elif fd == self.stderr.fd:
            self._read(self.stderr)
        elif fd == self.in_fd:
            self._write()
        elif fd == self.pidfd:
            self.exited = True
            self._forget(self.pidfd)
            self.pidfd = -2  # known exited; no polling fallback

    def request_stop(self) -> None:
        if not self.exited and self.ending is None and not self.complete:
            self._end("stop", time.monotonic())

    def advance(self, now: float) -> float | None:
        """Act on what is due at `now`; the next moment something will be due."""
        if self.complete:
            return None
        if self.pidfd >= 0 and self.deadline is None and self.kill_at is None:
            return None  # running, its exit watched: nothing is due (most children)
        if self.pidfd == -1 and not self.exited:
            self.exited = _has_exited(self.pid)
        if (
            self.deadline is not None
            and now >= self.deadline
            and not self.exited
            and self.ending is None
        ):
            self._end("timeout", now)
        if self.kill_at is not None and not self.killed and now >= self.kill_at:
            self._kill(signal.SIGKILL)
            self.killed = True
        if self.exited:
            if (self.stdout.fd < 0 and self.stderr.fd < 0) or self.killed:
                self.complete = True
                return None
            if self.ending is None:
                if self.drain_until is None:
                    self.drain_until = now + DRAIN_AFTER_EXIT
                elif now >= self.drain_until:
                    self.complete = True
                    return None
        wake = [t for t in (self.drain_until, self.kill_at) if t is not None]
        if self.deadline is not None and self.ending is None and not self.exited:
            wake.append(self.deadline)
        if self.pidfd == -1 and not self.exited:
            wake.append(now + _EXIT_POLL_SECONDS)
        return min(wake) if wake else None

    def _end(self, why: str, now: float) -> None:
        if self.pid and _has_exited(self.pid):
            # It ended on its own a moment ago (its exit not handled yet):
            # its own exit status stands, not a stop or timeout it never saw.
            self.exited = True
            return
        self.ending = why
        self._kill(signal.SIGTERM)
        self.kill_at = now + self.term_grace

    def _kill(self, sig: int) -> None:
        if self.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    # -- ending -----------------------------------------------------------------

    def finish(self) -> Outcome:
        """Reap the child, release everything, and say how it ended."""
        if self.start_error is not None:
            return Outcome(
                start_error=self.start_error,
                never_starts=self.never_starts,
                duration=time.monotonic() - self.started,
                timeout=self.command.timeout,
            )
        try:
            if self.ending is not None and not self.killed:
                # The child is gone (or closed its output and left). Whatever
                # is left of its group goes too; the unreaped child still pins
                # the group id, so this cannot hit a recycled one.
                self._kill(signal.SIGKILL)
            if self.error is None:
                try:
                    self._drain(self.stdout)
                    self._drain(self.stderr)
                    # Each stream's last line, unterminated: whole if the cap allows.
                    for stream in (self.stdout, self.stderr):
                        partial = stream.partial
                        if partial and not self.capped and self._emit(partial, whole=False):
                            self.forwarded_lines += 1
                except Exception as exc:  # on_line raised
                    self.fail(exc)
            returncode = self._reap()
        finally:
            self._close_all()
        usage = self.usage
        if self.output_bytes:
            lines = self.stdout.lines_seen() + self.stderr.lines_seen()
            tail = _decode_tail(self.tail, self.output_bytes)
            stdout, stderr = self.stdout.output(), self.stderr.output()
        else:  # most jobs write nothing
            lines, tail, stdout, stderr = 0, "", _NO_OUTPUT, _NO_OUTPUT
        return Outcome(
            exit_code=returncode if returncode >= 0 else None,
            signal=-returncode if returncode < 0 else None,
            timed_out=self.ending == "timeout",
            stopped=self.ending == "stop",
            stop_reason=self.stop.reason if self.ending == "stop" and self.stop else None,
            output_tail=tail,
            output_bytes=self.output_bytes,
            stdout=stdout,
            stderr=stderr,
            left_out_bytes=self.output_bytes - self.forwarded_bytes,
            left_out_lines=lines - self.forwarded_lines,
            duration=time.monotonic() - self.started,
            timeout=self.command.timeout,
            cpu_user=usage.ru_utime if usage is not None else None,
            cpu_system=usage.ru_stime if usage is not None else None,
            max_rss_bytes=usage.ru_maxrss * _MAXRSS_UNIT if usage is not None else None,
        )

    def abandon(self) -> None:
        """Kill the child's group and reap it: its outcome is not wanted."""
        if self.pid and self.returncode is None:
            self._kill(signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                self._reap()
        self._close_all()

    def _reap(self) -> int:
        if self.returncode is None:
            if self.tracked and self.reactor.guard is not None:
                # Before the group id can be reused: the guard must never
                # signal a group that is not this job's.
                self.reactor.guard.ended(self.pid)
                self.tracked = False
            try:
                _, status, self.usage = os.wait4(self.pid, 0)
            except ChildProcessError:
                if self.popen is None:
                    raise
                status = 0  # as Popen.wait says of a child reaped elsewhere
            self.returncode = os.waitstatus_to_exitcode(status)
            if self.popen is not None:
                # Reaped here, for its rusage: Popen must never wait on this
                # pid again (it may belong to another process by then).
                self.popen.returncode = self.returncode
        return self.returncode

    # -- output and input -------------------------------------------------------

    def _read(self, stream: KeptStream) -> None:
        bulk = self.capped and stream.bulk
        try:
            chunk = os.read(stream.fd, _BULK_READ_SIZE if bulk else _OUTPUT_READ_SIZE)
        except BlockingIOError:
            return
        if not chunk:
            self._forget(stream.fd)
            stream.fd = -1
            return
        self._keep(stream, chunk)
        if self.capped and not bulk and len(chunk) == _OUTPUT_READ_SIZE:
            stream.go_bulk()

    def _drain(self, stream: KeptStream) -> None:
        """Read what is already in one output pipe, then stop reading it."""
        if stream.fd < 0:
            return
        os.set_blocking(stream.fd, False)
        for _ in range(64):  # bounded: a runaway writer may never stop
            try:
                chunk = os.read(stream.fd, _READ_SIZE)
            except BlockingIOError:
                return
            if not chunk:
                return
            self._keep(stream, chunk)

    def _keep(self, stream: KeptStream, chunk: bytes) -> None:
        self.output_bytes += len(chunk)
        _keep_last(self.tail, chunk, 0, TAIL_BYTES)
        stream.keep(chunk)
        if not self.capped:
            self._lines(stream, chunk)

    def _lines(self, stream: KeptStream, chunk: bytes) -> None:
        data = stream.partial + chunk if stream.partial else chunk
        stream.partial = b""
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if not self._emit(data[start:end], whole=True):
                return
            start = end + 1
        rest = data[start:]
        while len(rest) > MAX_LINE_BYTES:
            if not self._emit(rest[:MAX_LINE_BYTES], whole=False):
                return
            rest = rest[MAX_LINE_BYTES:]
        stream.partial = rest

    def _emit(self, line: bytes, *, whole: bool) -> bool:
        """Hand `line` to `on_line`, in pieces of MAX_LINE_BYTES, as far as
        the cap allows; False once it allows no more (the rest is left out).
        `whole`: the line's newline came with it."""
        assert self.on_line is not None
        for i in range(0, max(len(line), 1), MAX_LINE_BYTES):
            piece = line[i : i + MAX_LINE_BYTES]
            if self.lines_allowed <= 0 or self.bytes_allowed < len(piece):
                if self.lines_allowed > 0 and self.bytes_allowed > 0:
                    self._forward(piece[: self.bytes_allowed])  # what still fits
                self.capped = True
                return False
            self._forward(piece)
        if whole:  # its newline counts too
            self.forwarded_lines += 1
            self.forwarded_bytes += 1
            self.bytes_allowed -= 1
        return True

    def _forward(self, piece: bytes) -> None:
        assert self.on_line is not None
        self.lines_allowed -= 1
        self.bytes_allowed -= len(piece)
        self.forwarded_bytes += len(piece)
        self.on_line(piece.decode("utf-8", "replace"))

    def _write(self) -> None:
        try:
            while self.pending:
                written = os.write(self.in_fd, self.pending[:_READ_SIZE])
                self.pending = self.pending[written:]
        except BlockingIOError:
            return
        except OSError:  # EPIPE: the child stopped reading; not our failure
            pass
        self._forget(self.in_fd)
        self.in_fd = -1

    # -- file descriptors -------------------------------------------------------

    def _pipe(self) -> tuple[int, int]:
        r, w = os.pipe()
        self.fds.update((r, w))
        return r, w

    def _forget(self, fd: int) -> None:
        self.reactor.forget(fd)
        self._close(fd)

    def _close(self, fd: int) -> None:
        if fd in self.fds:
            self.fds.discard(fd)
            os.close(fd)

    def _close_all(self) -> None:
        for fd in list(self.fds):
            self.reactor.forget(fd)
            self._close(fd)


class KeptStream:
    """One output pipe of a child (its stdout or its stderr): its fd while
    open, what is kept of it, and its line in progress for `on_line`."""

    __slots__ = (
        "bulk",
        "ends_open",
        "fd",
        "head",
        "head_bytes",
        "newlines",
        "partial",
        "tail",
        "tail_bytes",
        "total",
    )

    def __init__(self, keep: OutputKeep) -> None:
        self.fd = -1
        self.head_bytes = max(keep.head_bytes, 0)
        self.tail_bytes = max(keep.tail_bytes, 0)
        self.head = bytearray()
        self.tail = bytearray()  # the last tail_bytes of what came after the head
        self.total = 0
        self.newlines = 0
        self.ends_open = False  # what it wrote so far ends in an unterminated line
        self.partial = b""
        self.bulk = False  # read in large pieces, from a larger pipe

    def go_bulk(self) -> None:
        """Only counted and kept from now on, and more is coming: take it
        in large reads, from a larger pipe (Linux), so that the child's
        writes seldom wait."""
        self.bulk = True
        if _F_SETPIPE_SZ is not None:
            with contextlib.suppress(OSError):  # over the user's pipe quota: as it is
                fcntl.fcntl(self.fd, _F_SETPIPE_SZ, _BULK_PIPE_SIZE)

    def keep(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.newlines += chunk.count(b"\n")
        self.ends_open = chunk[-1:] != b"\n"
        start = 0
        room = self.head_bytes - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            start = room
        if self.tail_bytes and start < len(chunk):
            _keep_last(self.tail, chunk, start, self.tail_bytes)

    def lines_seen(self) -> int:
        return self.newlines + (1 if self.ends_open else 0)

    def output(self) -> StreamOutput:
        if not self.total:
            return _NO_OUTPUT
        omitted = self.total - len(self.head) - len(self.tail)
        if not omitted:  # all of it was kept: one piece, nothing twice
            whole = bytes(self.head + self.tail)
            return StreamOutput(head=whole.decode("utf-8", "replace"), total_bytes=self.total)
        return StreamOutput(
            head=self.head.decode("utf-8", "replace"),
            tail=_decode_cut(self.tail),
            total_bytes=self.total,
            omitted_bytes=omitted,
        )


def _keep_last(kept: bytearray, chunk: bytes, start: int, limit: int) -> None:
    """Append `chunk[start:]` to `kept`, keeping only its last `limit` bytes."""
    if len(chunk) - start >= limit:
        kept[:] = chunk[len(chunk) - limit :]
        return
    kept += chunk[start:] if start else chunk
    if len(kept) > limit:
        del kept[:-limit]  # cheap: a bytearray drops its front without copying


def _decode_cut(data: bytearray) -> str:
    """Bytes that follow a cut: a character the cut split is one U+FFFD."""
    skip = 0
    while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
        skip += 1
    text = data[skip:].decode("utf-8", "replace")
    return "\ufffd" + text if skip else text


def _spawn(argv: Sequence[str], env: Mapping[str, str], stdin: int, out_w: int, err_w: int) -> int:
    """posix_spawn `argv` in a session of its own, stdin from `stdin`, stdout
    to `out_w` and stderr to `err_w`; its pid. Raises OSError as Popen would."""
    _close_on_exec_inherited_fds()
    actions = [
        (os.POSIX_SPAWN_DUP2, stdin, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]

    def spawn(program: str) -> int:
        assert _posix_spawn is not None
        return _posix_spawn(
            program, argv, env, setsid=True, setsigdef=_RESTORED_SIGNALS, file_actions=actions
        )

    program = find_program(argv[0], env)
    try:
        return spawn(program)
    except FileNotFoundError:
        if program == argv[0]:
            raise
    # Removed since it was looked up: look again, once.
    _forget_program(argv[0], env)
    return spawn(find_program(argv[0], env))


def _wakeup() -> tuple[int, int]:
    """An fd poll() can wait on, and one to write to wake it (may be the same)."""
    if _eventfd is not None:
        fd = _eventfd(0, _EVENTFD_FLAGS)
        return fd, fd
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


_DEVNULL: list[int] = []


def _devnull() -> int:
    """One read-only /dev/null for every child's stdin, opened on first use."""
    if not _DEVNULL:
        _DEVNULL.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
    return _DEVNULL[0]


def find_program(program: str, env: Mapping[str, str]) -> str:
    """The file that runs `program`, looked up in the child's PATH as Popen
    does (posix_spawnp would search the worker's own PATH).

    A lookup is remembered for `_LOOKUP_SECONDS`: a PATH of ten directories
    costs some twenty system calls, more than the rest of starting a child.
    A program installed earlier in PATH is therefore seen that much later;
    one removed is looked up again at once (`_forget_program`).
    """
    if "/" in program:
        return program
    path = env.get("PATH")
    if path is None:
        path = os.defpath
    key = (program, path)
    now = time.monotonic()
    found = _LOOKUPS.get(key)
    if found is not None and found[1] > now:
        return found[0]
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or os.curdir, program)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            if len(_LOOKUPS) >= _LOOKUPS_KEPT:
                _LOOKUPS.clear()
            _LOOKUPS[key] = (candidate, now + _LOOKUP_SECONDS)
            return candidate
    for directory in path.split(os.pathsep):
        if os.path.isfile(os.path.join(directory or os.curdir, program)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def _forget_program(program: str, env: Mapping[str, str]) -> None:
    _LOOKUPS.pop((program, env.get("PATH", os.defpath)), None)


_LOOKUP_SECONDS = 1.0
_LOOKUPS_KEPT = 1000
# (program, PATH) -> (file, until when it is trusted). Used by whichever
# threads watch children: a lost race costs a lookup, nothing more.
_LOOKUPS: dict[tuple[str, str], tuple[str, float]] = {}


_INHERITED_FDS_CLOSED: list[bool] = []


def _close_on_exec_inherited_fds() -> None:
    """Mark every fd above stderr close-on-exec, once per process.

    Popen closes every other fd in the child; posix_spawn keeps whatever is
    inheritable. Python makes its own fds non-inheritable, but the worker may
    have been started with open fds of its parent's: children must not get them.
    """
    if _INHERITED_FDS_CLOSED:
        return
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 256))
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):
                os.set_inheritable(fd, False)
    _INHERITED_FDS_CLOSED.append(True)


def _has_exited(pid: int) -> bool:
    """Whether the child has exited, leaving it unreaped (so its group id stays pinned)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def _poke(fd: int) -> None:
    # A full pipe is already readable: the waiter wakes either way.
    with contextlib.suppress(OSError):
        os.write(fd, _ONE)


def _start_error(exc: Exception, command: Command, env: Mapping[str, str]) -> str:
    program = _shown(command.argv[0] if command.argv else "")
    if isinstance(exc, ValueError):
        return f"cannot start {program}: {exc}"
    assert isinstance(exc, OSError)
    where = command.cwd
    if where is not None and exc.filename == where and exc.filename != command.argv[0]:
        if isinstance(exc, FileNotFoundError):
            return f"working directory not found: {where}"
        if isinstance(exc, NotADirectoryError):
            return f"working directory is not a directory: {where}"
        if isinstance(exc, PermissionError):
            return f"cannot enter working directory {where}: permission denied"
        return f"cannot enter working directory {where}: {exc.strerror}"
    if isinstance(exc, FileNotFoundError):
        # The file that failed: the program as given, or as found on PATH.
        file = exc.filename if isinstance(exc.filename, str) else command.argv[0]
        if "/" in file and os.path.exists(file):
            return f"cannot run {program}: its #! interpreter was not found"
        return f"command not found: {program}"
    if isinstance(exc, PermissionError):
        return f"permission denied: {program} (is it executable?)"
    if exc.errno == errno.ENOEXEC:
        return f"cannot run {program}: not an executable (missing #! line?)"
    if exc.errno == errno.E2BIG:
        return (
            f"cannot start {program}: its arguments and environment are too long for the "
            f"system ({_exec_bytes(command.argv, env):,} bytes; the limit is "
            f"{_arg_max():,}, and {_MAX_ARG_BYTES:,} for any one of them): "
            "pass large data on stdin or in a file"
        )
    return f"cannot start {program}: {exc.strerror or exc}"


def _never_starts(exc: Exception, command: Command) -> bool:
    """Whether a start error is the command's own, the same at every try: a
    program that is not there, or arguments the system refuses. A missing
    working directory or a permission may be fixed between two tries."""
    if isinstance(exc, ValueError):  # a NUL in an argument or variable
        return True
    if isinstance(exc, FileNotFoundError):
        return exc.filename is None or exc.filename != command.cwd
    return isinstance(exc, OSError) and exc.errno in (errno.E2BIG, errno.ENAMETOOLONG)


# The most of a program's name a message shows: it may be anything a payload holds.
_SHOWN_CHARS = 200
# Linux refuses any single argument or variable longer than this (MAX_ARG_STRLEN).
_MAX_ARG_BYTES = 32 * 4096


def _shown(program: str) -> str:
    if len(program) <= _SHOWN_CHARS:
        return program
    return f"{program[:_SHOWN_CHARS]}... ({len(program):,} characters)"


def _exec_bytes(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """What exec copies for the new program: each argument and NAME=value, NUL-ended."""
    size = sum(len(os.fsencode(arg)) + 1 for arg in argv)
    return size + sum(len(os.fsencode(k)) + len(os.fsencode(v)) + 2 for k, v in env.items())


def _arg_max() -> int:
    try:
        return os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        return 131072


def _decode_tail(tail: bytearray, total: int) -> str:
    data = bytes(tail)
    if total > len(data):
        # The cut may have split a UTF-8 character: drop its loose end.
        skip = 0
        while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
            skip += 1
        data = data[skip:]
    return data.decode("utf-8", "replace")


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
