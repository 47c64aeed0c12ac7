"""Progress bars on stderr, shown only when it is a terminal."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any


@contextlib.contextmanager
def progress(total: int | None, description: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal; yields `advance(n)`."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


class _FileProgress:
    """A progress bar on stderr over the bytes of a file read so far, and the
    jobs sent."""

    def __init__(self, size: int | None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self.task = self.bar.add_task("enqueueing", total=size)

    def lines(self, f: Iterable[bytes]) -> Iterator[bytes]:
        done = 0
        for number, line in enumerate(f, start=1):
            done += len(line)
            if number % 10000 == 0:
                self.bar.update(self.task, completed=done)
            yield line
        self.bar.update(self.task, completed=done)

    def sent(self, count: int) -> None:
        self.bar.update(self.task, description=f"enqueueing: {count:,} jobs")


@contextlib.contextmanager
def file_progress(f: Any) -> Iterator[_FileProgress | None]:
    """A progress bar over reading `f` when stderr is a terminal, else None."""
    if not sys.stderr.isatty():
        yield None
        return
    try:
        size = os.fstat(f.fileno()).st_size  # 0 for a pipe: the bar then just pulses
    except (OSError, ValueError):
        size = 0
    progress = _FileProgress(size or None)
    with progress.bar:
        yield progress
