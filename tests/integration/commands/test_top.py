"""`pgqctl top` in a real terminal (a tmux pane), and refused without one."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.processes import PATIENCE, start_pgqctl
from tests.support.servers import (
    REPO_ROOT,
    clean_env,
    insert_jobs,
    missing,
    pgqctl,
    unique,
    wait_until,
)

__all__ = ["start_pgqctl"]


class Pane:
    """A shell in a tmux pane of a fixed size, on a tmux server of its own."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def tmux(self, *args: str) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=PATIENCE,
            check=True,
        )
        return result.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "top")

    def state(self, variable: str) -> str:
        return self.tmux("display-message", "-p", "-t", "top", f"#{{{variable}}}").strip()


@contextmanager
def pane_of(columns: int, lines: int) -> Iterator[Pane]:
    if shutil.which("tmux") is None:
        missing("tmux is not installed: `apt-get install tmux`")
    made = Pane(unique("pgqctl-top"))
    # Not COLUMNS or LINES (a parallel test worker has them, at 80 by 24): top
    # must size itself by the pane's terminal, as in a real one.
    env = " ".join(
        f"{k}={shlex.quote(v)}"
        for k, v in clean_env().items()
        if k.isidentifier() and k not in ("COLUMNS", "LINES")
    )
    made.tmux(
        *("new-session", "-d", "-s", "top", "-x", str(columns), "-y", str(lines)),
        f"env -i {env} TERM=screen sh",
    )
    try:
        yield made
    finally:
        made.tmux("kill-server")


@pytest.fixture
def pane() -> Iterator[Pane]:
    with pane_of(110, 40) as made:
        yield made


def queue_row(screen: str) -> list[str] | None:
    """The cells of the `default` queue's row: queue, pending, running, done/s, ..."""
    for line in screen.splitlines():
        cells = line.split()  # the columns are apart by spaces; no value here has one
        if len(cells) > 2 and cells[0] == "default":
            return cells
    return None


def run_top(pane: Pane, dsn: str, tmp_path: Path) -> None:
    script = tmp_path / "top.sh"
    script.write_text(
        f"cd {shlex.quote(str(REPO_ROOT))}\n"
        f"{shlex.quote(sys.executable)} -m pgqctl top --dsn {shlex.quote(dsn)} --interval 300ms\n"
        'echo "top exited $?"\n'
        # What top left the terminal's modes at: canonical input and echo again.
        "stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon -e echo -e -echo\n"
        # The script's end: its every line is on the screen (a busy machine
        # may show "top exited" well before the modes).
        "echo modes shown\n"
    )
    # bash waits for top to handle Ctrl-C itself (sh would die of it at once).
    pane.tmux("send-keys", "-t", "top", f"bash {shlex.quote(str(script))}", "Enter")
    wait_until(lambda: "pgqctl top" in pane.screen(), PATIENCE, "top to draw")


def kind_row(screen: str) -> list[str] | None:
    """The row of kind `test` in top's run times section, split, if shown."""
    if "run times, last minute" not in screen:
        return None
    section = screen.split("run times, last minute", 1)[1]
    for line in section.splitlines():
        words = line.split()
        if words[:1] == ["test"] and len(words) == 5:
            return words
    return None


@pytest.mark.slow
def test_top_shows_the_queue_move_and_q_restores_the_terminal(
    dsn: str, pane: Pane, tmp_path: Path, start_pgqctl: object
) -> None:
    insert_jobs(dsn, [["sleep", "0.5"]] * 60)  # about 7.5 s of work for 4 slots
    run_top(pane, dsn, tmp_path)
    wait_until(lambda: queue_row(pane.screen()) is not None, PATIENCE, "the queue's row")
    first = queue_row(pane.screen())
    assert first is not None and first[1] == "60" and first[2] == "0"  # pending, running
    assert pane.state("alternate_on") == "1"  # on the alternate screen

    worker = start_pgqctl("worker", "--burst", "--concurrency", "4", "--dsn", dsn)  # type: ignore[operator]
    pid = worker.proc.pid  # type: ignore[attr-defined]
    # Both read from the screens drawn while the worker runs (in any order:
    # a busy machine may draw the worker's row before the first done/s).
    moving, listed = False, False

    def seen_running() -> bool:
        nonlocal moving, listed
        screen = pane.screen()
        row = queue_row(screen)
        moving = moving or (bool(row) and int(row[1]) < 60 and float(row[3]) > 0)  # done/s
        # The worker's registry row: its host:pid, active.
        listed = listed or any(
            f":{pid}" in line and "active" in line for line in screen.splitlines()
        )
        return moving and listed

    wait_until(seen_running, PATIENCE, "top to show jobs being done and the worker active")
    assert worker.wait(60) == 0  # type: ignore[attr-defined]
    # The drained queue keeps its row, at 0 pending and 0 running, frame
    # after frame (a queue with only done jobs is not in the live counts).
    try:
        wait_until(
            lambda: (queue_row(pane.screen()) or ["", "?", "?"])[1:3] == ["0", "0"],
            PATIENCE,
            "pending and running to reach 0",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the screen:\n{pane.screen()}") from None
    time.sleep(1.0)  # more than three refreshes later
    assert (queue_row(pane.screen()) or ["", "?", "?"])[1:3] == ["0", "0"], pane.screen()
    # The last minute's run times of the kind: 60 attempts, each about 0.5 s.
    wait_until(
        lambda: (kind_row(pane.screen()) or ["", ""])[1] == "60",
        PATIENCE,
        "the run times of the kind's 60 attempts",
    )
    row = kind_row(pane.screen())
    assert row is not None
    assert all(0.45 <= float(p.rstrip("s")) < 5 for p in row[2:]), row

    pane.tmux("send-keys", "-t", "top", "q")
    wait_until(lambda: "modes shown" in pane.screen(), PATIENCE, "top to exit")
    screen = pane.screen()
    assert "top exited 0" in screen
    assert "pgqctl top" not in screen  # the alternate screen left, the shell's shown again
    assert pane.state("alternate_on") == "0" and pane.state("cursor_flag") == "1"
    modes = screen.split("top exited 0", 1)[1].split()
    assert "icanon" in modes and "echo" in modes


def test_ctrl_c_leaves_top_cleanly_too(dsn: str, pane: Pane, tmp_path: Path) -> None:
    run_top(pane, dsn, tmp_path)
    pane.tmux("send-keys", "-t", "top", "C-c")
    wait_until(lambda: "modes shown" in pane.screen(), PATIENCE, "top to exit")
    screen = pane.screen()
    assert "top exited 0" in screen and "Traceback" not in screen
    assert pane.state("alternate_on") == "0" and pane.state("cursor_flag") == "1"
    modes = screen.split("top exited 0", 1)[1].split()
    assert "icanon" in modes and "echo" in modes


def test_top_not_on_a_terminal_points_to_stats_watch(dsn: str) -> None:
    result = pgqctl("top", "--dsn", dsn, input="")
    assert result.returncode == 2 and result.stdout == ""
    assert "top needs a terminal" in result.stderr and "pgqctl stats --watch 1" in result.stderr


def test_top_at_80_by_30_keeps_its_header_on_one_line_and_every_active_worker(
    dsn: str, tmp_path: Path
) -> None:
    """Was: the header on 2 lines (3 with a longer DSN), and the leases
    pushing the second worker off the bottom of the screen."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for n, queue in enumerate(["emails-transactional", "images", "reports"]):
            conn.execute("INSERT INTO jobs (queue, kind, payload) VALUES (%s, 'k', '{}')", [queue])
            conn.execute(
                "INSERT INTO workers (id, host, pid, version, concurrency, heartbeat_seconds,"
                " lease_seconds) VALUES (%s, 'vm', %s, '', 6, 3600, 300)",
                [f"vm:{100 + n}", 100 + n],
            )
        conn.execute(
            "INSERT INTO jobs (queue, kind, payload, status, attempts, locked_by, locked_until)"
            " SELECT 'images', 'k', '{}', 'running', 1, 'vm:100:' || i, now() + '5 minutes'"
            " FROM generate_series(1, 12) AS i"
        )
    with pane_of(80, 30) as pane:
        run_top(pane, dsn, tmp_path)
        try:
            wait_until(lambda: "vm:102" in pane.screen(), PATIENCE, "every worker on the screen")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen:\n{pane.screen()}") from None
        lines = pane.screen().splitlines()
        pane.tmux("send-keys", "-t", "top", "q")
    assert lines[0].startswith("pgqctl top ") and lines[1] == "queues"
    assert all(any(line.startswith(f" vm:{pid} ") for line in lines) for pid in (100, 101, 102))
    assert any(line.lstrip().startswith("+") and "more" in line for line in lines)


def test_top_shows_each_limit_what_runs_under_it_and_what_it_holds_back(
    dsn: str, tmp_path: Path, start_pgqctl: object
) -> None:
    set_limit = pgqctl("limit", "set", "--kind", "report", "--concurrency", "1", "--dsn", dsn)
    assert set_limit.returncode == 0, set_limit.stderr
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobs (kind, payload) SELECT 'report', "
            """'{"argv": ["sleep", "60"]}' FROM generate_series(1, 3)"""
        )
    start_pgqctl("worker", "--concurrency", "2", "--grace", "1s", "--dsn", dsn)  # type: ignore[operator]
    with pane_of(80, 30) as pane:
        run_top(pane, dsn, tmp_path)
        # One runs (the limit's only seat); two are due and held back by it.
        row = ["kind", "report", "concurrency", "1", "1/1", "2"]
        try:
            wait_until(
                lambda: any(line.split()[:6] == row for line in pane.screen().splitlines()),
                PATIENCE,
                "the limit's row: 1 of 1 running, 2 held back",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen:\n{pane.screen()}") from None
        lines = pane.screen().splitlines()
        pane.tmux("send-keys", "-t", "top", "q")
    assert "limits" in lines and lines.index("limits") > lines.index("queues")
    assert all(len(line) <= 80 for line in lines)
