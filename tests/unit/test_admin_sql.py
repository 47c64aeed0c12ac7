"""The admin section's SQL keeps in step with the statuses."""

from __future__ import annotations

import pytest

from pgqctl.jobs import CANCELLABLE, STATUS_NAMES
from pgqctl.sql import query


@pytest.mark.parametrize("name", ["job_list", "job_count"])
def test_every_status_has_its_arm_in_the_list_filters(name: str) -> None:
    # One arm per status, so each is read through its own partial index.
    text = " ".join(query(name).split())
    for status in STATUS_NAMES:
        assert f"(status='{status}' AND '{status}'=ANY(%(statuses)s::text[]))" in text


def test_cancel_takes_the_statuses_the_state_machine_lets_it() -> None:
    assert CANCELLABLE == ("pending", "running")


@pytest.mark.parametrize("name", ["job_cancel_select", "job_cancel"])
def test_every_status_cancel_takes_has_its_arm(name: str) -> None:
    text = " ".join(query(name).split())
    for status in CANCELLABLE:
        assert f"(status='{status}' AND '{status}'=ANY(%(statuses)s::text[]))" in text
    assert text.count("ANY(%(statuses)s::text[])") == len(CANCELLABLE)
