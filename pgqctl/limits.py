"""The sizes pgqctl accepts in a job and in the names an operator gives.

One place for the numbers that `enqueue`, `pause`, `schedule` and the
worker check, and that the docs state, and for the checks themselves.
Names are bounded so that every index holding them stays far below
PostgreSQL's btree limit (about 2,700 bytes a row: a queue and a unique key
of 4-byte characters at these limits take 1,536); a payload, so that one row
cannot make the worker or a read command load hundreds of megabytes. A name
(a queue, a kind, a schedule) holds only printable characters, so that every
view and log line shows it as one line, as typed, and no name can pass for
another (a zero-width space, a bidi override); a key (unique, limit) comes
from a job's data rather than an operator, and holds no control character.
"""

from __future__ import annotations

import itertools
import re

from pgqctl.errors import BadInput

# A job's payload, as JSON text in UTF-8. The worker and `enqueue` take
# --max-payload-bytes to raise it.
MAX_PAYLOAD_BYTES = 1024 * 1024
# Queue, kind and schedule names, in characters.
MAX_NAME_CHARS = 128
# A unique key, in characters.
MAX_KEY_CHARS = 256
# Kinds in one enqueue of one payload to several kinds. Far above the
# consumers one event has; a longer list is a mistake (a list of ids given
# as kinds).
MAX_KINDS = 1000
# Levels of arrays and objects a payload may nest. Well below where Python's
# json and the recursive walks of a decoded value (JSON output, pretty
# printing) run out of stack, far above what a job's payload needs.
MAX_PAYLOAD_DEPTH = 256

# C0 controls, DEL and C1 controls: what a terminal or a log reader may act on.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
# A JSON string, whose brackets do not nest; and a bracket.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(r"[\[\]{}]")
_NESTING = {"[": 1, "{": 1, "]": -1, "}": -1}


# Names checked as keys by `check_name`: any character but a control one.
_KEYS = frozenset(("unique_key", "limit_key"))


def unprintable(name: str) -> str | None:
    """What makes `name` unfit to name a queue, a kind or a schedule, or None:
    its first character that is not printable (str.isprintable: a control,
    format, separator other than the space, private-use or unassigned one),
    and where. The one rule: `enqueue` refuses such a name (`check_name`), a
    worker fails the job of a row that has one (rows.claimed_payload), and
    the views escape such characters (text.printable)."""
    at = _first_unprintable(name)
    return None if at is None else _held(name[at], at)


def check_name(what: str, name: str, limit: int = MAX_NAME_CHARS) -> None:
    """BadInput when a name (`what`: "queue", "kind", "schedule name"...) is
    longer than `limit` characters or is not printable (`unprintable`), or
    when a key ("unique_key", "limit_key") holds a control character."""
    if len(name) > limit:
        raise BadInput(
            f"{what} is {len(name):,} characters long: the limit is {limit:,} characters; "
            f"give a shorter {what}"
        )
    if what in _KEYS:
        found = None if name.isprintable() else _CONTROL.search(name)
        at = None if found is None else found.start()
    else:
        at = _first_unprintable(name)
    if at is None:
        return
    if _CONTROL.match(name[at]):
        rule = "names cannot hold control characters (tabs and line ends included)"
    else:
        rule = "names hold printable characters only (workers refuse any other)"
    raise BadInput(f"{what} {_held(name[at], at)}: {rule}")


def _first_unprintable(name: str) -> int | None:
    if name.isprintable():  # quick for the common name
        return None
    return next(i for i, c in enumerate(name) if not c.isprintable())


def _held(c: str, at: int) -> str:
    """`c`, the character at index `at` of a name, in words."""
    if _CONTROL.match(c):
        return f"holds the control character \\x{ord(c):02x} at character {at + 1}"
    import unicodedata  # only for a name refused

    called = unicodedata.name(c, "")
    shown = f"U+{ord(c):04X} ({called})" if called else f"U+{ord(c):04X}"
    return f"holds the unprintable character {shown} at character {at + 1}"


def nested_deeper_than(text: str, depth: int) -> bool:
    """Whether the JSON `text` nests arrays and objects more than `depth` levels."""
    # Short text, or few brackets, cannot nest deep: the common case costs
    # a length, or two C-speed counts.
    if len(text) <= 2 * depth or text.count("[") + text.count("{") <= depth:
        return False
    # The deepest level is the highest running sum of +1 per opening and -1
    # per closing bracket outside strings: done by the C loops of re and
    # itertools, some 20 ms for a megabyte of brackets.
    brackets = _BRACKET.findall(_STRING.sub("", text))
    return max(itertools.accumulate(map(_NESTING.__getitem__, brackets)), default=0) > depth


def payload_bytes(text: str) -> int:
    """The size of a payload's JSON text in UTF-8."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def check_payload(text: str, limit: int = MAX_PAYLOAD_BYTES) -> None:
    """BadInput when a payload's JSON text is over `limit` bytes in UTF-8."""
    size = payload_bytes(text)
    if size > limit:
        raise BadInput(
            f"payload is {size:,} bytes as JSON: the limit is {limit:,} bytes; pass large "
            "data by reference (a path, a URL, a row id), or raise the limit: `enqueue "
            "--max-payload-bytes`, max_payload_bytes= in the Python API, and the same on "
            "the workers"
        )
    if nested_deeper_than(text, MAX_PAYLOAD_DEPTH):
        raise BadInput(
            f"payload nests arrays and objects more than {MAX_PAYLOAD_DEPTH} levels deep, "
            "which workers refuse: flatten it"
        )
