"""pgqctl.runner: running real processes, one at a time and many at once."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from pgqctl import runner
from pgqctl.runner import (
    MAX_LINE_BYTES,
    TAIL_BYTES,
    Command,
    Outcome,
    OutputCap,
    OutputKeep,
    Stop,
)
from tests.conftest import alive, gone
from tests.support.runner_helpers import run

ENV = dict(os.environ)


def sh(script: str, *, timeout: float | None = None) -> Command:
    return Command(("/bin/sh", "-c", script), timeout=timeout)


def grandchild(pidfile: Path) -> int:
    return int(pidfile.read_text())


# -- running ----------------------------------------------------------------------


def test_exit_zero_succeeds() -> None:
    outcome = run(sh("echo hello"), ENV)
    assert outcome.succeeded
    assert (outcome.exit_code, outcome.signal, outcome.output_tail) == (0, None, "hello\n")
    assert outcome.describe() == "exit status 0"
    assert outcome.duration > 0


def test_non_zero_exit_fails_with_stdout_and_stderr_in_the_tail() -> None:
    outcome = run(sh("echo out; echo err >&2; exit 3"), ENV)
    assert not outcome.succeeded
    assert outcome.exit_code == 3
    assert outcome.output_tail == "out\nerr\n"
    assert outcome.last_error() == "exit status 3\nout\nerr"


def test_death_by_signal() -> None:
    outcome = run(sh("kill -9 $$"), ENV)
    assert (outcome.exit_code, outcome.signal) == (None, signal.SIGKILL)
    assert outcome.describe() == "killed by signal 9 (SIGKILL)"
    assert not outcome.succeeded


def test_child_leads_its_own_session() -> None:
    script = "import os; print(os.getsid(0) == os.getpid() == os.getpgid(0))"
    assert run(Command((sys.executable, "-c", script)), ENV).output_tail == "True\n"


def test_timeout_kills_the_child_and_its_grandchild(pidfile: Path) -> None:
    outcome = run(sh(f"sleep 100 & echo $! > {pidfile}; wait", timeout=0.5), ENV, term_grace=5)
    assert outcome.timed_out and not outcome.succeeded
    assert outcome.signal == signal.SIGTERM
    assert outcome.describe() == "timed out after 0.5s"
    assert outcome.duration < 3  # SIGTERM sufficed; no wait for the grace
    assert gone(grandchild(pidfile))


def test_child_ignoring_sigterm_is_killed_after_the_grace(pidfile: Path) -> None:
    script = f"trap '' TERM; sleep 100 & echo $! > {pidfile}; wait"
    outcome = run(sh(script, timeout=0.3), ENV, term_grace=0.3)
    assert outcome.timed_out
    assert outcome.signal == signal.SIGKILL
    assert outcome.describe() == "timed out after 0.3s (still running after SIGTERM, killed)"
    assert outcome.duration >= 0.6
    assert gone(grandchild(pidfile))


def test_grandchild_ignoring_sigterm_is_killed_after_the_grace(pidfile: Path) -> None:
    # The child dies of SIGTERM at once; its grandchild holds the output open.
    script = f"(trap '' TERM; exec sleep 100) & echo $! > {pidfile}; wait"
    outcome = run(sh(script, timeout=0.3), ENV, term_grace=0.3)
    assert outcome.timed_out
    assert outcome.signal == signal.SIGTERM
    assert outcome.duration >= 0.6
    assert gone(grandchild(pidfile))


def test_stop_from_another_thread_ends_the_child_and_its_group(pidfile: Path) -> None:
    stop = Stop()
    threading.Timer(0.2, stop.request, ("lease lost",)).start()
    outcome = run(sh(f"sleep 100 & echo $! > {pidfile}; wait"), ENV, stop=stop)
    assert outcome.stopped and not outcome.succeeded and not outcome.timed_out
    assert outcome.stop_reason == "lease lost"
    assert outcome.describe() == "stopped: lease lost"
    assert outcome.duration < 3
    assert gone(grandchild(pidfile))


def test_one_stop_ends_several_children() -> None:
    stop = Stop()
    outcomes: list[Outcome] = []
    threads = [
        threading.Thread(target=lambda: outcomes.append(run(sh("sleep 100"), ENV, stop=stop)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    stop.request("shutdown")
    for thread in threads:
        thread.join(5)
    assert [o.describe() for o in outcomes] == ["stopped: shutdown"] * 3


def test_stop_requested_before_start_runs_nothing(tmp_path: Path) -> None:
    stop = Stop()
    assert stop.request("shutdown") is True
    assert stop.request("lease lost") is False  # the first reason stays
    outcome = run(sh(f"touch {tmp_path / 'ran'}"), ENV, stop=stop)
    assert outcome.stopped and outcome.exit_code is None
    assert outcome.describe() == "stopped before start: shutdown"
    assert not (tmp_path / "ran").exists()


def test_stop_wait_returns_when_requested() -> None:
    stop = Stop()
    assert stop.wait(0.01) is False and not stop.requested
    threading.Timer(0.1, stop.request, ("shutdown",)).start()
    assert stop.wait(5) is True
    assert stop.requested and stop.reason == "shutdown"
    assert stop.wait() is True


def test_stop_after_the_child_ended_changes_nothing() -> None:
    stop = Stop()
    outcome = run(sh("true"), ENV, stop=stop)
    stop.request("late")
    assert outcome.succeeded


def test_command_not_found() -> None:
    outcome = run(Command(("pgqctl-no-such-command", "x")), ENV)
    assert outcome.start_error == "command not found: pgqctl-no-such-command"
    assert (outcome.exit_code, outcome.signal, outcome.succeeded) == (None, None, False)
    assert outcome.describe() == outcome.last_error() == "command not found: pgqctl-no-such-command"
    assert outcome.never_starts


def test_arguments_too_long_never_start_and_say_so() -> None:
    outcome = run(Command(("echo", "x" * 200_000)), ENV)
    assert outcome.never_starts
    assert outcome.start_error is not None
    assert outcome.start_error.startswith(
        "cannot start echo: its arguments and environment are too long for the system ("
    )
    # A program name of any size is shown cut.
    outcome = run(Command(("y" * 300_000,)), ENV)
    assert outcome.never_starts
    assert outcome.start_error is not None and len(outcome.start_error) < 400


def test_program_looked_up_in_the_child_path(tmp_path: Path) -> None:
    program = tmp_path / "only-here"
    program.write_text("#!/bin/sh\necho found\n")
    program.chmod(0o755)
    env = {**ENV, "PATH": f"{tmp_path}:{ENV['PATH']}"}
    assert run(Command(("only-here",)), env).output_tail == "found\n"


def test_missing_working_directory(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    outcome = run(Command(("true",), cwd=str(missing)), ENV)
    assert outcome.start_error == f"working directory not found: {missing}"


def test_working_directory_that_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("")
    outcome = run(Command(("true",), cwd=str(file)), ENV)
    assert outcome.start_error == f"working directory is not a directory: {file}"


def test_working_directory_is_used(tmp_path: Path) -> None:
    assert run(Command(("pwd",), cwd=str(tmp_path)), ENV).output_tail == f"{tmp_path}\n"


def test_program_not_executable(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    outcome = run(Command((str(script),)), ENV)
    assert outcome.start_error == f"permission denied: {script} (is it executable?)"


def test_script_with_missing_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "job"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    outcome = run(Command((str(script),)), ENV)
    assert outcome.start_error == f"cannot run {script}: its #! interpreter was not found"


def test_script_on_path_with_missing_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "job"
    script.write_text("#!/nonexistent/interpreter\n")
    script.chmod(0o755)
    outcome = run(Command(("job",)), {**ENV, "PATH": str(tmp_path)})
    assert outcome.start_error == "cannot run job: its #! interpreter was not found"


def test_empty_command_is_a_start_error() -> None:
    assert run(Command(()), ENV).start_error == "empty command: nothing to run"


def test_stdin_is_delivered() -> None:
    assert run(Command(("cat",), stdin=b"line one\nline two"), ENV).output_tail == (
        "line one\nline two"
    )


def test_no_stdin_means_end_of_file_at_once() -> None:
    outcome = run(Command(("cat",), timeout=5), ENV)
    assert outcome.succeeded and outcome.output_tail == ""


def test_large_stdin_while_the_child_floods_output() -> None:
    # cat writes back all it reads: a runner that wrote stdin before reading
    # output would deadlock with both pipes full.
    data = os.urandom(3_000_000)
    outcome = run(Command(("cat",), stdin=data, timeout=20), ENV)
    assert outcome.succeeded
    assert outcome.output_bytes == len(data)


def test_child_that_ignores_its_stdin() -> None:
    outcome = run(Command(("true",), stdin=b"x" * 1_000_000, timeout=10), ENV)
    assert outcome.succeeded


def test_huge_output_keeps_only_the_tail() -> None:
    script = "head -c 50000000 /dev/zero | tr '\\0' a; echo; echo END"
    tracemalloc.start()
    try:
        outcome = run(sh(script, timeout=60), ENV)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.succeeded
    assert outcome.output_bytes == 50_000_000 + len("\nEND\n")
    assert len(outcome.output_tail) == TAIL_BYTES
    assert outcome.output_tail.endswith("aaa\nEND\n")
    assert peak < 1_000_000


def test_huge_output_with_on_line_stays_bounded() -> None:
    pieces = 0

    def count(line: str) -> None:
        nonlocal pieces
        pieces += 1

    tracemalloc.start()
    try:
        outcome = run(sh("head -c 20000000 /dev/zero | tr '\\0' a", timeout=60), ENV, on_line=count)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.succeeded
    assert pieces == -(-20_000_000 // MAX_LINE_BYTES)
    assert peak < 1_000_000


def test_tail_does_not_start_with_half_a_character() -> None:
    outcome = run(sh("i=0; while [ $i -lt 1000 ]; do printf 'ééééé'; i=$((i+1)); done"), ENV)
    assert outcome.output_bytes == 10_000
    assert set(outcome.output_tail) == {"é"}


def test_on_line_gets_whole_lines() -> None:
    lines: list[str] = []
    script = (
        "printf 'hel'; sleep 0.1; printf 'lo\\nwor'; sleep 0.1; printf 'ld\\n\\n'; "
        "printf 'bad \\377 byte\\n'; printf 'no newline'"
    )
    outcome = run(sh(script), ENV, on_line=lines.append)
    assert outcome.succeeded
    assert lines == ["hello", "world", "", "bad \ufffd byte", "no newline"]


def test_on_line_gets_a_very_long_line_in_pieces() -> None:
    lines: list[str] = []
    run(sh("head -c 40000 /dev/zero | tr '\\0' a; echo"), ENV, on_line=lines.append)
    assert [len(line) for line in lines] == [MAX_LINE_BYTES, MAX_LINE_BYTES, 40000 % MAX_LINE_BYTES]
    assert "".join(lines) == "a" * 40000


def test_a_cap_limits_what_on_line_gets_and_counts_the_rest() -> None:
    lines: list[str] = []
    script = "printf 'one\\ntwo\\nthree\\nfour\\nfive'"
    outcome = run(sh(script), ENV, on_line=lines.append, cap=OutputCap(lines=2, bytes=100))
    assert lines == ["one", "two"]
    assert (outcome.left_out_lines, outcome.left_out_bytes) == (3, len("three\nfour\nfive"))
    assert outcome.output_tail == "one\ntwo\nthree\nfour\nfive"  # the tail is whole

    lines.clear()
    outcome = run(sh(script), ENV, on_line=lines.append, cap=OutputCap(lines=10, bytes=9))
    assert lines == ["one", "two", "t"]  # the bytes left cut the third line
    assert (outcome.left_out_lines, outcome.left_out_bytes) == (3, len("hree\nfour\nfive"))

    lines.clear()
    outcome = run(sh(script), ENV, on_line=lines.append, cap=OutputCap(lines=5, bytes=100))
    assert lines == ["one", "two", "three", "four", "five"]
    assert (outcome.left_out_lines, outcome.left_out_bytes) == (0, 0)


def test_output_past_the_cap_is_drained_at_once() -> None:
    # 20 MB of 2-byte lines, one line logged: read in large pieces, not split.
    lines: list[str] = []
    outcome = run(
        sh("yes | head -c 20000000", timeout=60), ENV, on_line=lines.append, cap=OutputCap(1, 10)
    )
    assert outcome.succeeded and lines == ["y"]
    assert (outcome.left_out_lines, outcome.left_out_bytes) == (9_999_999, 19_999_998)


def test_on_line_raising_kills_the_child_and_propagates(pidfile: Path) -> None:
    def explode(line: str) -> None:
        raise RuntimeError(f"log sink broke on {line!r}")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="log sink broke on 'x'"):
        run(sh(f"sleep 100 & echo $! > {pidfile}; echo x; wait"), ENV, on_line=explode)
    assert time.monotonic() - started < 50  # not the 100 s of the sleep
    assert gone(grandchild(pidfile))


def test_background_process_left_behind_does_not_hold_the_job(pidfile: Path) -> None:
    outcome = run(sh(f"sleep 100 & echo $! > {pidfile}; echo done"), ENV)
    assert outcome.succeeded and outcome.output_tail == "done\n"
    assert outcome.duration < 2
    assert alive(grandchild(pidfile))  # documented: left alone (the fixture kills it)


def test_child_that_closes_its_output_is_still_waited_for() -> None:
    outcome = run(sh("exec >/dev/null 2>&1; sleep 0.3; exit 4"), ENV)
    assert outcome.exit_code == 4
    assert outcome.duration >= 0.3


def test_timeout_applies_after_the_child_closes_its_output() -> None:
    outcome = run(sh("exec >/dev/null 2>&1; sleep 100", timeout=0.3), ENV)
    assert outcome.timed_out and outcome.duration < 3


def test_last_error_is_bounded() -> None:
    outcome = run(sh("seq 1 5000; exit 1"), ENV)
    text = outcome.last_error(limit=100)
    first, note, tail = text.split("\n", 2)
    assert first == "exit status 1"
    assert note == f"[output truncated: last 100 characters of {outcome.output_bytes} bytes]"
    assert len(tail) == 100 and tail.endswith("4999\n5000")
    assert len(outcome.last_error()) < 2100


# -- how children start -------------------------------------------------------------


def test_child_gets_default_sigpipe_and_sigxfsz() -> None:
    # Python ignores SIGPIPE; a child must not inherit that (a pipeline would
    # loop on EPIPE instead of ending).
    outcome = run(Command(("grep", "SigIgn", "/proc/self/status")), ENV)
    ignored = int(outcome.output_tail.split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    assert not ignored & (1 << (signal.SIGXFSZ - 1))


def test_inheritable_fds_of_the_worker_do_not_reach_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if the worker had been started with an open fd of its parent's.
    monkeypatch.setattr(runner, "_INHERITED_FDS_CLOSED", [])
    r, w = os.pipe()
    try:
        os.set_inheritable(w, True)
        outcome = run(Command(("ls", "/proc/self/fd")), ENV)
        assert str(w) not in outcome.output_tail.split()
    finally:
        os.close(r)
        os.close(w)


def test_program_removed_after_lookup_is_looked_up_again(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for directory, said in ((first, "first"), (second, "second")):
        directory.mkdir()
        program = directory / "which-one"
        program.write_text(f"#!/bin/sh\necho {said}\n")
        program.chmod(0o755)
    env = {**ENV, "PATH": f"{first}:{second}"}
    assert run(Command(("which-one",)), env).output_tail == "first\n"
    (first / "which-one").unlink()
    assert run(Command(("which-one",)), env).output_tail == "second\n"


def test_program_on_path_without_execute_permission(tmp_path: Path) -> None:
    program = tmp_path / "not-executable"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o644)
    outcome = run(Command(("not-executable",)), {**ENV, "PATH": str(tmp_path)})
    assert outcome.start_error == "permission denied: not-executable (is it executable?)"


# -- the supervisor: many children from one thread ----------------------------------


class Collected:
    """What a Supervisor reported, by key."""

    def __init__(self) -> None:
        self.outcomes: dict[object, Outcome] = {}
        self.errors: dict[object, BaseException] = {}
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, key: object, outcome: Outcome, error: BaseException | None) -> None:
        with self.lock:
            self.outcomes[key] = outcome
            if error is not None:
                self.errors[key] = error
            self.threads.add(threading.current_thread().name)

    def wait_for(self, count: int, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while len(self.outcomes) < count:
            assert time.monotonic() < deadline, f"only {len(self.outcomes)} of {count} ended"
            time.sleep(0.01)


def test_supervisor_runs_children_side_by_side() -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)
    try:
        started = time.monotonic()
        for n in range(6):
            supervisor.submit(n, sh(f"sleep 2; echo {n}; exit {n}"), ENV)
        got.wait_for(6)
        elapsed = time.monotonic() - started
    finally:
        supervisor.close(5)
    assert elapsed < 10  # not one after the other (12 s), however busy the machine
    assert {k: (o.exit_code, o.output_tail) for k, o in got.outcomes.items()} == {
        n: (n, f"{n}\n") for n in range(6)
    }
    assert got.threads == {"pgqctl-children"}


def test_supervisor_stops_one_child_and_lets_the_others_run(pidfile: Path) -> None:
    got = Collected()
    supervisor = runner.Supervisor(got, term_grace=5)
    stop = Stop()
    try:
        supervisor.submit("stopped", sh(f"sleep 100 & echo $! > {pidfile}; wait"), ENV, stop=stop)
        supervisor.submit("kept", sh("sleep 0.5; echo kept"), ENV, stop=Stop())
        supervisor.submit("timed out", sh("sleep 100", timeout=0.3), ENV)
        time.sleep(0.2)
        stop.request("lease lost")
        got.wait_for(3)
    finally:
        supervisor.close(5)
    assert got.outcomes["stopped"].describe() == "stopped: lease lost"
    assert gone(grandchild(pidfile))
    assert got.outcomes["kept"].succeeded and got.outcomes["kept"].output_tail == "kept\n"
    assert got.outcomes["timed out"].timed_out


def test_supervisor_reports_start_errors_and_stops_before_start(tmp_path: Path) -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)
    stop = Stop()
    stop.request("shutdown")
    try:
        supervisor.submit("missing", Command(("pgqctl-no-such-command",)), ENV)
        supervisor.submit("stopped", sh(f"touch {tmp_path / 'ran'}"), ENV, stop=stop)
        supervisor.submit("fine", sh("true"), ENV)
        got.wait_for(3)
    finally:
        supervisor.close(5)
    assert got.outcomes["missing"].start_error == "command not found: pgqctl-no-such-command"
    assert got.outcomes["stopped"].describe() == "stopped before start: shutdown"
    assert not (tmp_path / "ran").exists()
    assert got.outcomes["fine"].succeeded


def test_supervisor_says_when_each_process_exists_before_its_output() -> None:
    got = Collected()
    events: list[tuple[object, str]] = []

    def on_start(key: object, pid: int) -> None:
        # The process is there: its own pid is what it prints.
        events.append((key, f"pid {pid}"))

    supervisor = runner.Supervisor(got, on_start=on_start)
    try:
        supervisor.submit(
            "ran", sh("echo $$"), ENV, on_line=lambda line: events.append(("ran", line))
        )
        supervisor.submit("missing", Command(("pgqctl-no-such-command",)), ENV)
        supervisor.submit("refused", Command(()), ENV)
        got.wait_for(3)
    finally:
        supervisor.close(5)
    [(_, started), (_, printed)] = events
    assert started == f"pid {printed}"
    assert got.outcomes["ran"].succeeded
    assert got.outcomes["missing"].start_error and got.outcomes["refused"].start_error


def test_supervisor_start_callback_raising_kills_that_child(tmp_path: Path) -> None:
    got = Collected()

    def on_start(key: object, pid: int) -> None:
        raise RuntimeError("log sink broke")

    supervisor = runner.Supervisor(got, on_start=on_start)
    try:
        supervisor.submit("broken", sh(f"sleep 1; touch {tmp_path / 'ran'}"), ENV)
        got.wait_for(1)
    finally:
        supervisor.close(5)
    assert str(got.errors["broken"]) == "log sink broke"
    assert got.outcomes["broken"].signal == signal.SIGKILL
    time.sleep(1.2)
    assert not (tmp_path / "ran").exists()


def test_supervisor_output_callback_raising_kills_that_child_only(pidfile: Path) -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)

    def explode(line: str) -> None:
        raise RuntimeError(f"log sink broke on {line!r}")

    try:
        script = f"sleep 100 & echo $! > {pidfile}; echo x; wait"
        supervisor.submit("broken", sh(script), ENV, on_line=explode)
        supervisor.submit("fine", sh("sleep 0.3; echo fine"), ENV, on_line=lambda line: None)
        got.wait_for(2)
    finally:
        supervisor.close(5)
    assert str(got.errors["broken"]) == "log sink broke on 'x'"
    assert gone(grandchild(pidfile))
    assert "fine" not in got.errors
    assert got.outcomes["fine"].succeeded


def test_supervisor_close_kills_what_still_runs(pidfile: Path) -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)
    supervisor.submit("left", sh(f"sleep 100 & echo $! > {pidfile}; wait"), ENV)
    deadline = time.monotonic() + 5
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    supervisor.close(5)
    assert gone(grandchild(pidfile))
    assert got.outcomes == {}


def test_supervisor_reports_its_own_failure_on_a_child_and_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)
    watch = runner._Child._watch

    def broken_watch(child: runner._Child) -> None:
        if child.key == "broken":
            raise RuntimeError("poller broke")
        watch(child)

    monkeypatch.setattr(runner._Child, "_watch", broken_watch)
    try:
        supervisor.submit("broken", Command(("sleep", "4321.5")), ENV)
        supervisor.submit("fine", sh("echo fine"), ENV)
        got.wait_for(2)
    finally:
        supervisor.close(5)
    assert str(got.errors["broken"]) == "poller broke"
    # It had started: it was killed and reaped, not left behind.
    left = subprocess.run(["pgrep", "-f", "sleep 4321.5"], capture_output=True, text=True)
    assert left.stdout == ""
    assert got.outcomes["fine"].output_tail == "fine\n"


def test_one_stop_shared_by_a_child_that_never_started_still_stops_the_others() -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)
    stop = Stop()
    try:
        supervisor.submit("sleeping", sh("sleep 30"), ENV, stop=stop)
        supervisor.submit("missing", Command(("pgqctl-no-such-command",)), ENV, stop=stop)
        got.wait_for(1)
        stop.request("shutdown")
        got.wait_for(2, seconds=5)
    finally:
        supervisor.close(5)
    assert got.outcomes["sleeping"].describe() == "stopped: shutdown"


def test_supervisor_that_fails_reports_every_child_and_refuses_new_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)
    step = runner._Reactor.step
    broken = threading.Event()

    def failing_step(reactor: runner._Reactor, timeout: float | None = None) -> list[runner._Child]:
        if broken.is_set():
            raise OSError("poll broke")
        return step(reactor, timeout)

    monkeypatch.setattr(runner._Reactor, "step", failing_step)
    supervisor.submit("running", Command(("sleep", "4321.25")), ENV)
    time.sleep(0.3)
    broken.set()
    supervisor.submit("woke it", sh("true"), ENV)  # wakes the thread into the failure
    got.wait_for(2)
    supervisor.submit("after", sh("true"), ENV)
    got.wait_for(3)
    supervisor.close(5)
    assert isinstance(supervisor.failure, OSError)
    assert {key: str(error) for key, error in got.errors.items()} == {
        "running": "poll broke",
        "woke it": "poll broke",
        "after": "poll broke",
    }
    left = subprocess.run(["pgrep", "-f", "sleep 4321.25"], capture_output=True, text=True)
    assert left.stdout == ""  # killed and reaped


def test_a_child_flooding_output_does_not_hold_up_the_others() -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)

    def slow_sink(line: str) -> None:  # a log line costs time
        until = time.perf_counter() + 50e-6
        while time.perf_counter() < until:
            pass

    def ten_in_turn(first: int) -> float:
        started = time.monotonic()
        for n in range(first, first + 10):  # one after the other, each waiting for the loop
            supervisor.submit(n, sh("true"), ENV, on_line=slow_sink)
            got.wait_for(n + 1)
        return time.monotonic() - started

    try:
        alone = ten_in_turn(0)
        flood = Command(("yes", "flooding"), timeout=20)
        supervisor.submit("flood", flood, ENV, on_line=slow_sink)
        time.sleep(0.2)
        beside = ten_in_turn(10)
    finally:
        supervisor.close(5)
    # Reading a whole 64 KiB pipe per turn would cost about 0.3 s a turn
    # here, 3 s for the ten: compared with the same ten alone, so that a
    # busy machine, which slows both, does not decide.
    assert beside < alone + 3.0, (alone, beside)


def test_a_timeout_of_centuries_is_only_a_far_deadline() -> None:
    # poll() cannot wait that long: the loop must wake now and then, not fail.
    assert run(Command(("true",), timeout=1e300), ENV).succeeded
    got = Collected()
    supervisor = runner.Supervisor(got)
    try:
        supervisor.submit("far", sh("sleep 0.2", timeout=3e12), ENV)
        supervisor.submit("near", sh("exit 3", timeout=3e6), ENV)
        got.wait_for(2)
    finally:
        supervisor.close(5)
    assert supervisor.failure is None
    assert {k: o.exit_code for k, o in got.outcomes.items()} == {"far": 0, "near": 3}


# -- a caller that drives the supervisor itself --------------------------------------


def drive_until(supervisor: runner.Supervisor, got: Collected, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(got.outcomes) < count:
        assert time.monotonic() < deadline, f"only {len(got.outcomes)} of {count} ended"
        supervisor.drive(1.0)


def test_a_driving_caller_runs_the_children_on_its_own_thread() -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)
    try:
        supervisor.drive(0)  # from now on, this thread drives
        for n in range(3):
            supervisor.submit(n, sh(f"echo {n}; exit {n}"), ENV)
        drive_until(supervisor, got, 3)
    finally:
        supervisor.close(5)
    assert {k: (o.exit_code, o.output_tail) for k, o in got.outcomes.items()} == {
        n: (n, f"{n}\n") for n in range(3)
    }
    assert got.threads == {threading.current_thread().name}


def test_the_supervisors_thread_stands_in_while_the_caller_is_away(pidfile: Path) -> None:
    got = Collected()
    supervisor = runner.Supervisor(got, term_grace=5)
    try:
        supervisor.drive(0)
        supervisor.submit("slow", sh(f"sleep 100 & echo $! > {pidfile}; wait", timeout=0.3), ENV)
        started = time.monotonic()
        time.sleep(1.5)  # away, as in a slow statement: the timeout must not wait for us
        assert got.outcomes["slow"].timed_out
        assert got.outcomes["slow"].duration < 1.2
        assert got.threads == {"pgqctl-children"}
        assert gone(grandchild(pidfile))
        # Back: the caller drives again, and new children are its own.
        supervisor.drive(0)
        supervisor.submit("back", sh("exit 7"), ENV)
        drive_until(supervisor, got, 2)
        assert got.outcomes["back"].exit_code == 7
        assert time.monotonic() - started < 5
    finally:
        supervisor.close(5)
    assert got.threads == {"pgqctl-children", threading.current_thread().name}


def test_wake_ends_a_drive_early_and_close_kills_what_runs(pidfile: Path) -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)
    supervisor.drive(0)
    supervisor.submit("left", sh(f"echo $$ > {pidfile}; exec sleep 100"), ENV)
    while not pidfile.exists() or not pidfile.read_text():
        supervisor.drive(0.05)
    threading.Timer(0.2, supervisor.wake).start()
    started = time.monotonic()
    supervisor.drive(30)
    assert time.monotonic() - started < 20  # woken, not the 30 s
    supervisor.close(5)
    assert gone(grandchild(pidfile))
    assert got.outcomes == {}  # close reports nothing


def test_a_drive_that_fails_reports_every_child_and_refuses_new_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)
    supervisor.drive(0)
    supervisor.submit("running", Command(("sleep", "4321.5")), ENV)

    def failing_step(reactor: runner._Reactor, timeout: float | None = None) -> list[runner._Child]:
        raise OSError("poll broke")

    monkeypatch.setattr(runner._Reactor, "step", failing_step)
    supervisor.drive(0)  # fails: reported, not raised
    supervisor.submit("after", sh("true"), ENV)
    supervisor.drive(0)
    supervisor.close(5)
    assert isinstance(supervisor.failure, OSError)
    assert {key: str(error) for key, error in got.errors.items()} == {
        "running": "poll broke",
        "after": "poll broke",
    }
    left = subprocess.run(["pgrep", "-f", "sleep 4321.5"], capture_output=True, text=True)
    assert left.stdout == ""


def test_a_child_that_exited_before_a_stop_or_timeout_keeps_its_own_status() -> None:
    got = Collected()
    supervisor = runner.Supervisor(got)
    stop = Stop()
    try:
        supervisor.drive(0)  # this thread drives: nothing is handled while it sleeps
        supervisor.submit("stopped late", sh("exit 0"), ENV, stop=stop)
        supervisor.submit("timed out late", sh("exit 0", timeout=0.01), ENV)
        # Both exit; neither exit is seen (the supervisor's thread stands in
        # only after STANDBY away).
        time.sleep(runner.Supervisor.STANDBY / 2)
        stop.request("shutdown")
        drive_until(supervisor, got, 2)
    finally:
        supervisor.close(5)
    for key in ("stopped late", "timed out late"):
        outcome = got.outcomes[key]
        assert outcome.succeeded, (key, outcome.describe())
        assert not outcome.stopped and not outcome.timed_out


# -- each stream on its own, and what the child used ----------------------------------


def run_keeping(command: Command, keep: OutputKeep = runner.NO_KEEP, **kwargs: Any) -> Outcome:
    """One child through `Supervisor.submit`, with `keep`; its outcome."""
    got = Collected()
    supervisor = runner.Supervisor(got)
    try:
        supervisor.submit("job", command, ENV, keep=keep, **kwargs)
        got.wait_for(1, 60)
    finally:
        supervisor.close(5)
    assert not got.errors
    return got.outcomes["job"]


def py(script: str, **kwargs: Any) -> Command:
    return Command((sys.executable, "-c", script), **kwargs)


WRITE_BOTH = (
    "import sys, time\n"
    "out, err = sys.stdout.buffer, sys.stderr.buffer\n"
    "out.write(b'head-out' + b'.' * 1000); out.flush(); time.sleep(0.05)\n"
    "err.write(b'head-err' + b',' * 500); err.flush(); time.sleep(0.05)\n"
    "out.write(b'tail-out'); out.flush(); time.sleep(0.05)\n"
    "err.write(b'tail-err'); err.flush()\n"
)


def test_each_stream_keeps_its_own_head_and_tail_and_counts_all_of_it() -> None:
    outcome = run_keeping(py(WRITE_BOTH), OutputKeep(head_bytes=8, tail_bytes=8))
    assert outcome.succeeded
    assert outcome.stdout == runner.StreamOutput(
        head="head-out", tail="tail-out", total_bytes=1016, omitted_bytes=1000
    )
    assert outcome.stderr == runner.StreamOutput(
        head="head-err", tail="tail-err", total_bytes=516, omitted_bytes=500
    )
    # Both together, in the order written, as before.
    assert outcome.output_bytes == 1016 + 516
    assert outcome.output_tail == (
        "head-out" + "." * 1000 + "head-err" + "," * 500 + "tail-out" + "tail-err"
    )


def test_a_stream_that_fits_in_head_and_tail_is_all_in_the_head_once() -> None:
    keep = OutputKeep(head_bytes=8, tail_bytes=8)
    # Written in pieces, so that the cut between head and tail falls inside one.
    script = "printf 'abcde'; sleep 0.05; printf 'fghijk'; sleep 0.05; printf '%s' \"$1\""
    for rest, expected in (
        ("", runner.StreamOutput(head="abcdefghijk", total_bytes=11)),
        ("lmnop", runner.StreamOutput(head="abcdefghijklmnop", total_bytes=16)),
        ("lmnopq", runner.StreamOutput("abcdefgh", "jklmnopq", 17, omitted_bytes=1)),
    ):
        outcome = run_keeping(Command(("/bin/sh", "-c", script, "sh", rest)), keep)
        assert outcome.stdout == expected, rest
        assert outcome.stderr == runner.StreamOutput()


def test_a_head_larger_than_a_read_and_a_tail_of_its_own() -> None:
    script = "head -c 100000 /dev/zero | tr '\\0' a; printf END"
    outcome = run_keeping(sh(script), OutputKeep(head_bytes=70_000, tail_bytes=3))
    assert outcome.stdout == runner.StreamOutput(
        head="a" * 70_000, tail="END", total_bytes=100_003, omitted_bytes=30_000
    )
    outcome = run_keeping(sh(script), OutputKeep(head_bytes=0, tail_bytes=5))
    assert outcome.stdout == runner.StreamOutput("", "aaEND", 100_003, omitted_bytes=99_998)


def test_huge_stdout_keeps_only_head_and_tail_in_memory() -> None:
    script = "head -c 100000000 /dev/zero | tr '\\0' a; echo; echo END"
    keep = OutputKeep(head_bytes=65536, tail_bytes=65536)
    tracemalloc.start()
    try:
        outcome = run_keeping(sh(script, timeout=60), keep)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert outcome.succeeded
    total = 100_000_000 + len("\nEND\n")
    assert outcome.stdout.total_bytes == outcome.output_bytes == total
    assert outcome.stdout.head == "a" * 65536
    assert outcome.stdout.tail == "a" * (65536 - 5) + "\nEND\n"
    assert outcome.stdout.omitted_bytes == total - 2 * 65536
    assert outcome.stderr == runner.StreamOutput()
    assert peak < 1_000_000


def test_a_character_cut_at_either_end_of_the_gap_decodes() -> None:
    # "é" is two bytes: 5 bytes of head end in half of one, 5 of tail begin so.
    outcome = run_keeping(sh("printf 'éééééééééé' >&2"), OutputKeep(5, 5))
    assert outcome.stderr == runner.StreamOutput("éé\ufffd", "\ufffdéé", 20, omitted_bytes=10)
    # "€" is three bytes: cut after its first, and before its last.
    outcome = run_keeping(sh("printf 'x€€€€y'"), OutputKeep(2, 2))
    assert outcome.stdout == runner.StreamOutput("x\ufffd", "\ufffdy", 14, omitted_bytes=10)
    # When all of it is kept, no character is cut.
    outcome = run_keeping(sh("printf 'ééééé'"), OutputKeep(5, 5))
    assert outcome.stdout == runner.StreamOutput("ééééé", "", 10)


def test_keeping_nothing_still_counts_each_stream() -> None:
    for keep in (runner.NO_KEEP, OutputKeep(0, 0)):
        outcome = run_keeping(py(WRITE_BOTH), keep)
        assert outcome.stdout == runner.StreamOutput("", "", 1016, omitted_bytes=1016)
        assert outcome.stderr == runner.StreamOutput("", "", 516, omitted_bytes=516)
        assert outcome.output_bytes == 1532 and outcome.output_tail.endswith("tail-outtail-err")
    assert run(sh("echo hi; echo there >&2"), ENV).stdout.total_bytes == 3  # the default


def test_a_child_timed_out_or_stopped_still_reports_its_streams(pidfile: Path) -> None:
    script = f"echo out; echo err >&2; sleep 100 & echo $! > {pidfile}; wait"
    outcome = run_keeping(sh(script, timeout=0.5), OutputKeep(100, 100))
    assert outcome.timed_out and outcome.signal == signal.SIGTERM
    assert (outcome.stdout.head, outcome.stderr.head) == ("out\n", "err\n")
    assert outcome.cpu_user is not None and outcome.max_rss_bytes is not None
    assert gone(grandchild(pidfile))

    stop = Stop()
    threading.Timer(0.3, stop.request, ("lease lost",)).start()
    outcome = run_keeping(sh("echo out; echo err >&2; exec sleep 100"), OutputKeep(9, 9), stop=stop)
    assert outcome.stopped and outcome.signal == signal.SIGTERM
    assert (outcome.stdout.head, outcome.stderr.head) == ("out\n", "err\n")

    outcome = run_keeping(sh("echo out; echo err >&2; kill -9 $$"), OutputKeep(9, 9))
    assert outcome.signal == signal.SIGKILL
    assert (outcome.stdout.head, outcome.stderr.head) == ("out\n", "err\n")


def test_lines_are_cut_per_stream_and_the_cap_counts_both() -> None:
    lines: list[str] = []
    # stdout's line is still open when stderr's comes: neither cuts the other.
    script = "printf 'hel'; sleep 0.1; echo 'oops' >&2; sleep 0.1; echo lo; printf 'bye' >&2"
    outcome = run(sh(script), ENV, on_line=lines.append)
    assert lines == ["oops", "hello", "bye"]
    assert (outcome.left_out_lines, outcome.left_out_bytes) == (0, 0)

    lines.clear()
    outcome = run(sh(script), ENV, on_line=lines.append, cap=OutputCap(lines=2, bytes=100))
    assert lines == ["oops", "hello"]
    assert (outcome.left_out_lines, outcome.left_out_bytes) == (1, len("bye"))


# Spins in user space for 0.3 s of CPU (time.process_time is a system call:
# it is asked only now and then).
BUSY = (
    "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: sum(range(10000))\n"
)


def test_cpu_time_of_a_busy_child() -> None:
    outcome = run_keeping(py(BUSY))
    assert outcome.succeeded
    assert outcome.cpu_user is not None and outcome.cpu_user > 0.1
    assert outcome.cpu_system is not None and outcome.cpu_system >= 0


def test_cpu_time_counts_the_descendants_the_child_waited_for() -> None:
    outcome = run(sh(f"{sys.executable} -c '{BUSY}'; true"), ENV)
    assert outcome.cpu_user is not None and outcome.cpu_user > 0.1


def test_peak_memory_of_a_child() -> None:
    # Linux starts a child's peak at its parent's (this process's): allocate
    # 50 MB beyond that, so that what is measured is the child's own.
    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    size = floor + (50 << 20)
    script = f"import time\ndata = b'x' * {size}\ntime.sleep(0.05)\n"
    outcome = run_keeping(py(script))
    assert outcome.succeeded
    assert outcome.max_rss_bytes is not None and outcome.max_rss_bytes >= size
    # In bytes, not KiB.
    small = run(Command(("true",)), ENV).max_rss_bytes
    assert small is not None and 1_000_000 < small < size


def test_a_child_with_a_working_directory_reports_its_usage_too(tmp_path: Path) -> None:
    # A job with a cwd starts through Popen: it is reaped with wait4 all the same.
    script = BUSY + "import os, sys\nprint(os.getcwd()); print('err', file=sys.stderr)\nexit(3)\n"
    with runner._Reactor(5.0) as reactor:
        child = reactor.start(
            py(script, cwd=str(tmp_path)),
            ENV,
            stop=None,
            on_line=None,
            started=time.monotonic(),
            keep=OutputKeep(100, 100),
        )
        while not child.complete:
            reactor.step()
        outcome = reactor.finish(child)
    assert outcome.exit_code == 3
    assert (outcome.stdout.head, outcome.stderr.head) == (f"{tmp_path}\n", "err\n")
    assert outcome.cpu_user is not None and outcome.cpu_user > 0.1
    assert outcome.max_rss_bytes is not None and outcome.max_rss_bytes > 1_000_000
    # Popen knows the child was reaped: it never waits on that pid (maybe
    # another process's by now) again, and has nothing to warn about.
    assert child.popen is not None and child.popen.returncode == 3
    assert child.popen.poll() == 3 and child.popen.wait() == 3

    killed = run(Command(("/bin/sh", "-c", "kill -9 $$"), cwd=str(tmp_path)), ENV)
    assert killed.signal == signal.SIGKILL and killed.cpu_system is not None


def test_a_child_that_never_started_used_nothing_known() -> None:
    outcome = run_keeping(Command(("no-such-program-here",)), OutputKeep(10, 10))
    assert outcome.start_error is not None
    assert (outcome.cpu_user, outcome.cpu_system, outcome.max_rss_bytes) == (None, None, None)
    assert outcome.stdout == outcome.stderr == runner.StreamOutput()


def open_fds() -> set[int]:
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # listdir's own, closed since
            os.readlink(f"/proc/self/fd/{name}")
            fds.add(int(name))
    return fds


def test_open_files_needed_counts_every_descriptor_a_running_child_holds() -> None:
    # stdin larger than its pipe and read late: each child holds its stdout,
    # stderr and stdin pipes and its pidfd at once.
    command = Command(("/bin/sh", "-c", "sleep 0.5; cat > /dev/null"), stdin=b"x" * 200_000)
    children = 5
    runner._devnull()  # opened once per process, not per child
    with runner._Reactor(5.0) as reactor:
        before = open_fds()
        for _ in range(children):
            reactor.start(command, ENV, stop=None, on_line=None, started=time.monotonic())
        held = len(open_fds() - before)
        outcomes = []
        while reactor.children:
            outcomes += [reactor.finish(child) for child in reactor.step()]
    assert len(outcomes) == children and all(outcome.succeeded for outcome in outcomes)
    assert held == children * 4
    assert runner.open_files_needed(children) - runner.open_files_needed(0) >= held


def test_a_wake_the_stand_in_read_while_the_caller_was_away_returns_its_next_drive() -> None:
    """Was: an event posted from another thread while the worker's loop was
    between two drives (a resident handler's or a SQL job's result) could be
    read by the stand-in, and the loop then waited its whole timeout (up to
    the poll interval, seconds) before it saw the job end."""
    children = runner.Supervisor(lambda key, outcome, error: None)
    try:
        children.drive(0.0)  # this thread drives from now on
        time.sleep(runner.Supervisor.STANDBY * 3)  # away: the stand-in watches
        children.wake()  # an event for this thread's queue
        time.sleep(runner.Supervisor.STANDBY * 3)  # read by the stand-in
        began = time.monotonic()
        children.drive(10.0)
        assert time.monotonic() - began < 5.0
    finally:
        children.close(timeout=5)
