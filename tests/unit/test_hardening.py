"""The worker's protections against its own jobs: no database involved."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pgqctl.hardening import password_in


@pytest.mark.parametrize(
    ("dsn", "holds"),
    [
        ("postgresql://app:s3cret@db:5432/app", True),
        ("host=db dbname=app user=app password=s3cret", True),
        ("postgresql://app@db/app?password=s3cret", True),
        ("postgresql://app@db:5432/app", False),
        ("host=db password=''", False),
        ("", False),
        ("not a = valid dsn '", False),
    ],
)
def test_password_in_reads_urls_and_key_value_strings(dsn: str, holds: bool) -> None:
    assert password_in(dsn) is holds


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_make_undumpable_closes_the_process() -> None:
    # In a process of its own: it lasts until that process execs.
    script = (
        "import ctypes; from pgqctl.hardening import make_undumpable; "
        "before = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0); "  # PR_GET_DUMPABLE
        "done = make_undumpable(); "
        "print(before, done, ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["1", "True", "0"]
