"""How long pgqctl takes to start, against `python -c pass` and psql, in one run.

    python bench/startup_bench.py [--dsn DSN] [--rounds 20] [--code REV] [--no-bytecode]

Each round runs every side once, in an order that rotates from round to round:

  python   `python -c pass`: the interpreter pgqctl runs on, importing nothing;
  psql     `psql -X DSN -c 'select 1'`: a client that connects and runs a query;
  help     `pgqctl --help`;
  version  `pgqctl --version`;
  stats    `pgqctl stats` on an empty, migrated queue (it connects and queries).

With --code REV the three pgqctl sides run again with the pgqctl of that
commit (`REV.help`...), e.g. the code before a change, side by side.

pgqctl runs as its console script runs it (`from pgqctl.cli import main`),
from a copy of the code under test (this checkout as it is on disk, or the
commit's) whose bytecode the first, untimed run writes: as an installed copy
has it. With --no-bytecode nothing is written, so pgqctl's own modules are
compiled on every run, as where __pycache__ cannot be written (the
libraries it imports keep theirs).

Prints `name: median ms (min .. max)` for each side; each pgqctl side's
ratio to python and to psql (and to this checkout, for REV's), taken within
a round, then summarised, and the ratio of the two best times; then what
`python -X importtime` says of each side, best of 5: the imports' total
time, how many modules, and which of psycopg, rich and tabulate were among
them. A measurement, never a test: the machines are shared, so read
min .. max, and the best times, before trusting a median.

--dsn names a server where the bench may create and drop a database of its
own; the default is PGQCTL_TEST_DSN, else a throwaway embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import throwaway_db

REPO = Path(__file__).resolve().parent.parent
# What the `pgqctl` console script runs.
LAUNCH = "import sys; from pgqctl.cli import main; sys.exit(main())"
COMMANDS = {"help": ("--help",), "version": ("--version",), "stats": ("stats",)}
WATCHED = ("psycopg", "rich", "tabulate")


@dataclass(frozen=True)
class Side:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path | None = None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("PGQCTL_TEST_DSN"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--code", default=None, help="also time the pgqctl of this commit")
    parser.add_argument("--no-bytecode", action="store_true", help="compile pgqctl every run")
    args = parser.parse_args()

    with (
        throwaway_db.server(args.dsn) as server,
        throwaway_db.database(server) as dsn,
        tempfile.TemporaryDirectory(prefix="pgqctl-startup-") as tmp,
    ):
        env = _clean_environment(bytecode=not args.no_bytecode)
        codes = {"": _copy(None, Path(tmp) / "this")}
        if args.code:
            codes[f"{args.code}."] = _copy(args.code, Path(tmp) / "other")
        sides = [Side("python", (sys.executable, "-c", "pass"), env)]
        if shutil.which("psql"):
            sides.append(Side("psql", ("psql", "-X", "-q", dsn, "-c", "select 1"), env))
        else:
            print("# no psql on PATH: its side is left out", file=sys.stderr)
        for number, (prefix, code) in enumerate(codes.items()):
            # A schema of each code's own, migrated by that code: a commit's
            # migrations may differ from this checkout's.
            schema = f"startup_{number}"
            pgqctl_env = {**env, "PYTHONPATH": str(code), "PGQCTL_DSN": dsn}
            _run(
                Side("migrate", (sys.executable, "-c", LAUNCH, "migrate"), pgqctl_env, code),
                "--schema",
                schema,
            )
            for name, command in COMMANDS.items():
                extra = ("--schema", schema) if name == "stats" else ()
                argv = (sys.executable, "-c", LAUNCH, *command, *extra)
                sides.append(Side(prefix + name, argv, pgqctl_env, code))
        _describe(args, sides)
        for side in sides:  # untimed: writes the bytecode, warms the caches
            _run(side)
        times = _rounds(sides, args.rounds)
        importtimes = _importtimes([s for s in sides if s.name != "psql"], 5)

    for side in sides:
        _summary(side.name, [t * 1000 for t in times[side.name]], "ms")
    pgqctl_sides = [s.name for s in sides if s.name not in ("python", "psql")]
    for name in pgqctl_sides:
        for base in ("python", "psql"):
            if base in times:
                _ratio(name, base, times)
    for prefix in codes:
        if prefix:
            for name in COMMANDS:
                _ratio(prefix + name, name, times)
    for name, (total, modules) in importtimes.items():
        watched = sorted({m.split(".")[0] for m in modules} & set(WATCHED))
        print(
            f"importtime.{name}: {total / 1000:.1f} ms ({len(modules)} modules; "
            f"{', '.join(watched) if watched else 'none'} of {', '.join(WATCHED)})"
        )
    return 0


def _clean_environment(*, bytecode: bool) -> dict[str, str]:
    """This environment without the user's pgqctl and libpq settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PGQCTL_", "PG", "PYTHON")) and k != "DATABASE_URL"
    }
    if not bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _copy(rev: str | None, into: Path) -> Path:
    """pgqctl and its SQL, of this checkout as it is on disk or of commit
    `rev`, in a directory of their own, without bytecode."""
    into.mkdir()
    if rev is None:
        for part in ("pgqctl", "sql"):
            shutil.copytree(REPO / part, into / part, ignore=shutil.ignore_patterns("__pycache__"))
        return into
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "pgqctl", "sql"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _run(side: Side, *extra: str) -> float:
    """Seconds from start to exit of one run; a failed run stops the bench."""
    start = time.perf_counter()
    done = subprocess.run(
        [*side.argv, *extra],
        env=dict(side.env),
        cwd=side.cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{side.name} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed


def _rounds(sides: Sequence[Side], rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {side.name: [] for side in sides}
    for number in range(rounds):
        shift = number % len(sides)  # nothing always runs first, or right after another
        for side in [*sides[shift:], *sides[:shift]]:
            times[side.name].append(_run(side))
    return times


def _importtimes(sides: Sequence[Side], rounds: int) -> dict[str, tuple[int, list[str]]]:
    """Each side's least total import time (us) over `rounds` runs under
    -X importtime (in rotating order, as the timed rounds), and its modules."""
    best: dict[str, tuple[int, list[str]]] = {}
    for number in range(rounds):
        shift = number % len(sides)
        for side in [*sides[shift:], *sides[:shift]]:
            argv = (side.argv[0], "-X", "importtime", *side.argv[1:])
            done = subprocess.run(
                argv, env=dict(side.env), cwd=side.cwd, capture_output=True, text=True, check=True
            )
            # "import time: self [us] | cumulative | imported package"
            rows = [line.split("|") for line in done.stderr.splitlines()[1:]]
            rows = [row for row in rows if len(row) == 3 and row[0].startswith("import time:")]
            total = sum(int(row[0].removeprefix("import time:")) for row in rows)
            if side.name not in best or total < best[side.name][0]:
                best[side.name] = (total, [row[2].strip() for row in rows])
    return best


def _describe(args: argparse.Namespace, sides: Sequence[Side]) -> None:
    psql = subprocess.run(["psql", "--version"], capture_output=True, text=True, check=False)
    print(
        f"# {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; Python "
        f"{sys.version.split()[0]}; {psql.stdout.strip() if psql.returncode == 0 else 'no psql'}",
        file=sys.stderr,
    )
    mode = "compiled every run" if args.no_bytecode else "bytecode cached"
    print(f"# {args.rounds} rounds of {len(sides)} sides; pgqctl's modules {mode}", file=sys.stderr)


def _summary(name: str, values: Sequence[float], unit: str) -> None:
    print(
        f"{name}: {statistics.median(values):.1f} {unit} ({min(values):.1f} .. {max(values):.1f})"
    )


def _ratio(name: str, base: str, times: Mapping[str, Sequence[float]]) -> None:
    """The ratio within each round, summarised, and the ratio of the best
    times (the least disturbed run of each)."""
    ratios = [a / b for a, b in zip(times[name], times[base], strict=True)]
    best = min(times[name]) / min(times[base])
    print(
        f"ratio {name}/{base}: {statistics.median(ratios):.2f} x "
        f"({min(ratios):.2f} .. {max(ratios):.2f}; best to best {best:.2f} x)"
    )


if __name__ == "__main__":
    sys.exit(main())
