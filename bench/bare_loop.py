"""The barest worker loop there can be: what a `true` job costs at the least.

It follows the worker's claiming rule (item 4 of the worker's contract): one
statement, the worker's own exchange, reports the jobs that ended and claims
as many jobs as there are free slots, and commits at once. Everything else a
real worker must do is left out: no output capture, no log lines, no
timeouts, no lease renewal, no signal handling, no reconnects. What it keeps:
the statement and its round trip, posix_spawn of the job's argv with the job
id in the environment, and one poll() over the children's pidfds and the
connection's socket, in one thread.

So its rate bounds what any worker in Python that claims only for free slots
can reach on a machine. With ``ahead`` > 0 it claims that many jobs more than
it has free slots and starts them from a local queue (prefetch), which shows
what the claiming rule itself costs. With ``overlap`` off it waits for each
answer before it looks at its children again, as pgqctl's worker does: the
two side by side show what watching the children during an exchange is worth.
It keeps how long each exchange took, from its send to its whole answer.
"""

from __future__ import annotations

import json
import os
import re
import select
import time
from collections import deque
from typing import Any

import psycopg

from pgqctl import claims, limits

STATEMENT = b"pgqctl_bare_exchange"


def _positional(text: str) -> tuple[str, list[str]]:
    """The exchange with $n placeholders, and the parameter name of each n."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, text), names


class BareLoop:
    """Drain the queue with `slots` children at a time; `run` returns jobs/s."""

    def __init__(self, dsn: str, slots: int, ahead: int = 0, *, overlap: bool = True) -> None:
        self.slots = slots
        self.ahead = ahead
        self.overlap = overlap
        self.exchanges: list[float] = []  # seconds, send to whole answer
        self._sent_at = 0.0
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute("SET plan_cache_mode = force_generic_plan")
        text, self.names = _positional(claims.exchange_statement())
        self.pg: Any = self.conn.pgconn
        self.pg.prepare(STATEMENT, text.encode())
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def close(self) -> None:
        self.conn.close()

    def run(self) -> float:
        poller = select.poll()
        socket = self.pg.socket
        children: dict[int, tuple[int, tuple[int, int]]] = {}  # pidfd -> pid, (id, attempt)
        queued: deque[tuple[int, int, list[str]]] = deque()  # claimed, not started
        ended: list[tuple[int, int]] = []
        drained = False
        first = 0.0
        count = 0

        def send() -> int:
            want = 0 if drained else self.slots + self.ahead - len(children) - len(queued)
            self._send(ended, max(want, 0))
            ended.clear()
            if self.overlap:
                poller.register(socket, select.POLLIN)
            else:
                self._wait_for_answer(socket)
            return max(want, 0)

        in_flight = send()  # jobs asked for by the exchange on the wire; -1: none is
        while in_flight >= 0 or children or queued:
            # Without overlap the answer is in already (send waited for it).
            ready = poller.poll() if self.overlap or in_flight < 0 else [(socket, 0)]
            for fd, _ in ready:
                if fd == socket:
                    claimed = self._receive()
                    if claimed is None:
                        continue  # more of the answer to come
                    if self.overlap:
                        poller.unregister(socket)
                    drained = drained or len(claimed) < in_flight
                    in_flight = -1
                    queued.extend(claimed)
                else:
                    pid, held = children.pop(fd)
                    poller.unregister(fd)
                    os.close(fd)
                    os.waitpid(pid, 0)
                    ended.append(held)
                    count += 1
            while queued and len(children) < self.slots:
                job_id, attempt, argv = queued.popleft()
                first = first or time.perf_counter()
                env = {**self.env, "PGQCTL_JOB_ID": str(job_id)}
                pid = os.posix_spawnp(argv[0], argv, env)
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, (job_id, attempt))
                poller.register(pidfd, select.POLLIN)
            # A child that ended freed a slot: report it and claim for the free slots.
            if in_flight < 0 and ended:
                in_flight = send()
        return count / (time.perf_counter() - first) if count else 0.0

    def _send(self, ended: list[tuple[int, int]], claim: int) -> None:
        values = {
            "done": claims._held_json(ended).encode(),
            "failed": b"[]",
            "handed_back": b"[]",
            "reason": b"",
            "renew": b"[]",
            "limit": str(claim).encode(),
            "slots": None,
            "lease": b"300",
            "worker": b"bare:0",
            "queues": None,
            "kinds": None,
            "payload_chars": str(limits.MAX_PAYLOAD_BYTES + 1).encode(),
        }
        self._sent_at = time.perf_counter()
        self.pg.send_query_prepared(STATEMENT, [values[name] for name in self.names])

    def _wait_for_answer(self, socket: int) -> None:
        """Block until the whole answer is in (libpq keeps it for _receive)."""
        waiting = select.poll()
        waiting.register(socket, select.POLLIN)
        while True:
            self.pg.consume_input()
            if not self.pg.is_busy():
                return
            waiting.poll()

    def _receive(self) -> list[tuple[int, int, list[str]]] | None:
        """The claimed jobs (id, attempt, argv) once the whole answer is in; None before."""
        self.pg.consume_input()
        if self.pg.is_busy():
            return None
        self.exchanges.append(time.perf_counter() - self._sent_at)
        claimed = []
        while (result := self.pg.get_result()) is not None:
            if result.error_message:
                raise RuntimeError(result.error_message.decode())
            for row in range(result.ntuples):
                if result.get_value(row, 0) == b"claimed":
                    payload = result.get_value(row, 4)
                    argv = list(json.loads(payload)["argv"])
                    claimed.append(
                        (int(result.get_value(row, 1)), int(result.get_value(row, 5)), argv)
                    )
        return claimed
