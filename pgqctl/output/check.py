"""`check`: the thresholds a queue breaches."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from pgqctl.output.formats import emit_object, resolve_format
from pgqctl.text import ONE_LINE_ESCAPES, printable

if TYPE_CHECKING:
    from pgqctl.monitor import CheckResult


def emit_check(result: CheckResult, fmt: str) -> None:
    """JSON: every figure with its threshold; else one line per breach, nothing more."""
    if resolve_format(fmt) in ("json", "ndjson"):
        emit_object(result.as_json())
        return
    for line in result.breaches():
        sys.stdout.write(printable(line, ONE_LINE_ESCAPES) + "\n")
