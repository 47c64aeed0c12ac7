"""One event, many consumers: one job per kind for the same payload.

``pgqctl enqueue --kind a --kind b PAYLOAD``, a JSON line's ``"kinds"`` and
a list of kinds given to ``pgqctl.enqueue`` each make one job per kind, in
the order given, inserted together (all of them or none). From then on each
job is on its own: claimed by a worker that takes its kind, retried and
failed apart from the others.

A unique key given with a list of kinds holds per kind: the job of kind K
stores it as ``K:KEY``. A second enqueue of the same event then skips the
kinds whose job is still pending or running and adds the others, while the
table's one unique index, on (queue, unique_key), goes on serving every
producer as it is. ``K:KEY`` is also the key a one-kind enqueue of K would
give to share that job's slot. A limit key, by contrast, goes to every job
as given: the per-key limits of each kind (and of the queue) count it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pgqctl.errors import BadInput
from pgqctl.limits import MAX_KINDS

if TYPE_CHECKING:
    from pgqctl.intake.fields import NewJob

# The rows of one record are numbered N, N.001, N.002... (see row_number).
_POSITION_DIGITS = len(str(MAX_KINDS - 1))


def check_kinds(value: object, check_kind: Callable[[object], str], what: str) -> list[str]:
    """The kinds of a list given for one payload, each checked by `check_kind`
    (which names what is wrong with a kind); BadInput for anything but a
    list of 1 to MAX_KINDS distinct kinds. `what` names the list in errors."""
    if not isinstance(value, (list, tuple)):
        raise BadInput(f'{what} must be a list of kinds, such as ["send_receipt", "update_crm"]')
    if not value:
        raise BadInput(f"{what} must name at least one kind")
    if len(value) > MAX_KINDS:
        raise BadInput(f"{what} names {len(value):,} kinds: the limit is {MAX_KINDS:,}")
    kinds = []
    for position, kind in enumerate(value):
        try:
            kinds.append(check_kind(kind))
        except BadInput as exc:
            raise BadInput(f"{what}[{position}]: {exc}") from None
    if len(set(kinds)) < len(kinds):
        twice = next(k for n, k in enumerate(kinds) if k in kinds[:n])
        raise BadInput(f"{what} names the kind {twice!r} twice: give each kind once")
    return kinds


def fan_out(job: NewJob, kinds: Sequence[str]) -> list[NewJob]:
    """`job` (checked, of the first kind) once per kind, each with its kind's
    unique key (and the same limit key)."""
    key = job.unique_key
    return [
        job._replace(kind=kind, unique_key=None if key is None else f"{kind}:{key}")
        for kind in kinds
    ]


def row_number(number: int, position: int) -> int | str:
    """The number that orders the COPY row of the job for a record's
    `position`-th kind (from 0): the record's own number, then N.001,
    N.002...; the staging table's column is numeric, so they sort between
    N and N + 1, and `record_number` reads N back for error messages."""
    return number if position == 0 else f"{number}.{position:0{_POSITION_DIGITS}d}"


def record_number(field: str) -> int:
    """The record (line) number of a row's number field (see row_number)."""
    return int(field.partition(".")[0])
