"""`metrics`: the Prometheus text exposition, on stdout or in a textfile."""

from __future__ import annotations

import sys
from typing import Any

from pgqctl.errors import PgqctlError


def metrics_text(registry: Any) -> bytes:
    """The Prometheus text exposition of `registry`, written by prometheus_client."""
    from prometheus_client import generate_latest

    return generate_latest(registry)


def emit_metrics(registry: Any) -> None:
    sys.stdout.write(metrics_text(registry).decode())


def write_metrics_textfile(path: str, registry: Any) -> None:
    """The exposition written to a temporary file beside `path`, then renamed
    over it: a reader (node_exporter's textfile collector) sees the old file
    or the new one, never part of one; a failure leaves the old one."""
    from prometheus_client import write_to_textfile

    try:
        write_to_textfile(path, registry)
    except OSError as exc:
        # Named as given: the temporary file's name would only puzzle.
        raise PgqctlError(f"cannot write {path}: {exc.strerror or exc}") from exc
