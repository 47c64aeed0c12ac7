"""How the single-subject benches print: figures as `median unit (min .. max)`
on stdout, notes prefixed with `#` on stderr."""

from __future__ import annotations

import statistics
import sys


def summary(values: list[float], unit: str, digits: int | None = None) -> str:
    med, low, high = statistics.median(values), min(values), max(values)
    if digits is None:
        digits = 0 if med >= 100 else 3 if med < 1 else 2
    return f"{med:.{digits}f} {unit} ({low:.{digits}f} .. {high:.{digits}f})"


def say(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


def verdict(value: float, sense: str, bound: float, unit: str = "") -> str:
    """A figure's target (`sense` ">=" or "<=" `bound`) and whether `value` meets it."""
    met = value >= bound if sense == ">=" else value <= bound
    return f" [target {sense} {bound:g}{unit}: {'met' if met else 'not met'}]"
