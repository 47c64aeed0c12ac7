"""The worker's slots without a database: which slot a claimed job takes,
what is prefetched, which leases are renewed, and what a freed slot starts."""

from __future__ import annotations

from pgqctl.jobs import Job
from pgqctl.worker.slots import Slots


def jobs(*ids: int) -> list[Job]:
    return [Job(id=i, queue="default", kind="k", payload={}, attempts=1) for i in ids]


def test_a_claim_takes_the_lowest_free_slots_then_prefetches_the_rest() -> None:
    slots = Slots(concurrency=2, prefetch=2)
    assert slots.room() == 4
    free = slots.free_for(4)
    assert free == [0, 1]
    started = slots.claimed(jobs(10, 11, 12), free)
    assert [(r.job.id, r.slot) for r in started] == [(10, 0), (11, 1)]
    assert [(r.job.id, r.prefetched) for r in slots.prefetched] == [(12, True)]
    assert slots.room() == 1
    assert slots.free_for(1) == []
    assert slots.busy()


def test_a_short_claim_leaves_the_other_slots_free() -> None:
    slots = Slots(concurrency=3)
    started = slots.claimed(jobs(10), slots.free_for(3))
    assert [r.slot for r in started] == [0]
    assert slots.free_for(3) == [1, 2]
    assert not slots.prefetched


def test_a_freed_slot_starts_the_job_prefetched_first_and_the_next_exchange_moves_it() -> None:
    slots = Slots(concurrency=1, prefetch=2)
    [first] = slots.claimed(jobs(10, 11, 12), slots.free_for(3))
    assert slots.start_prefetched() is None  # no free slot yet
    assert slots.release(first)
    assert first.slot == -1 and (10, 1) not in slots.running
    started = slots.start_prefetched()
    assert started is not None
    assert (started.job.id, started.slot, started.prefetched) == (11, 0, False)
    assert [r.job.id for r in slots.prefetched] == [12]
    assert slots.to_move() == {(11, 1): 0}
    slots.moved()
    assert slots.to_move() == {}


def test_a_job_that_ended_before_the_exchange_is_not_moved() -> None:
    slots = Slots(concurrency=1, prefetch=1)
    [first] = slots.claimed(jobs(10, 11), slots.free_for(2))
    slots.release(first)
    started = slots.start_prefetched()
    assert started is not None
    slots.release(started)
    assert slots.to_move() == {}
    assert not slots.busy()


def test_a_released_job_without_a_slot_frees_none() -> None:
    slots = Slots(concurrency=1, prefetch=1)
    slots.claimed(jobs(10, 11), slots.free_for(2))
    [ahead] = slots.take_prefetched()
    assert not slots.release(ahead)
    assert slots.free_for(1) == []


def test_renewed_leases_are_the_running_ones_held_and_the_prefetched() -> None:
    slots = Slots(concurrency=3, prefetch=1)
    a, b, c = slots.claimed(jobs(10, 11, 12, 13), slots.free_for(4))
    b.lost = True
    c.completed = True
    assert slots.leased() == [(10, 1), (13, 1)]
    assert slots.leases_held()
    assert slots.live() == 2  # lost ones no longer count; completed ones still run
    a.lost = True
    slots.take_prefetched()
    assert slots.leased() == []
    assert not slots.leases_held()


def test_holding_finds_running_and_prefetched_jobs_but_not_lost_ones() -> None:
    slots = Slots(concurrency=1, prefetch=1)
    [running] = slots.claimed(jobs(10, 11), slots.free_for(2))
    assert slots.holding((10, 1)) is running
    ahead = slots.holding((11, 1))
    assert ahead is not None and ahead.prefetched
    assert slots.holding((10, 2)) is None  # another attempt: not ours
    running.lost = True
    assert slots.holding((10, 1)) is None
    slots.drop_prefetched(ahead)
    slots.drop_prefetched(ahead)  # twice is harmless
    assert slots.holding((11, 1)) is None
    assert not slots.prefetched
