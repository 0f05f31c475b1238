"""The replay log and the resumable sessions' checks (realtime_omni/resume.py), without a socket."""

from __future__ import annotations

import asyncio

import pytest

from realtime_omni.errors import RealtimeError, http_status
from realtime_omni.resume import Hold, Holds, ReplayLog


async def _record(log: ReplayLog, *ids: str, size: int = 10) -> list[bool]:
    return [await log.record(i, i.ljust(size, ".")) for i in ids]


async def test_events_handed_out_make_room_and_the_others_never_do():
    log = ReplayLog(max_events=3, max_bytes=1000)
    log.attach(0)
    assert await _record(log, "e1", "e2", "e3") == [True] * 3
    log.handed(2)  # e1, e2 went out
    assert await _record(log, "e4", "e5") == [True, True]
    assert (log.start, log.end, len(log)) == (2, 5, 3)
    assert log.position_after("e2") == 2  # the one just before the oldest held: resumable still
    assert log.position_after("e1") is None  # gone: a resume from it would lose e2
    log.detach()
    assert await _record(log, "e6") == [False]  # e3..e5 never went out: an overflow, not a loss
    assert (log.start, log.end) == (2, 5)


async def test_a_full_log_makes_the_recorder_wait_for_its_connection():
    log = ReplayLog(max_events=2, max_bytes=1000)
    log.attach(0)
    await _record(log, "e1", "e2")
    waiting = asyncio.create_task(log.record("e3", "e3"))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    assert await log.next(0) == "e1........"
    log.handed(1)
    assert await asyncio.wait_for(waiting, 1) is True
    assert log.position_after("e3") == 3 and log.position_after("e2") == 2


async def test_a_detach_while_waiting_is_an_overflow():
    log = ReplayLog(max_events=1, max_bytes=1000)
    log.attach(0)
    await _record(log, "e1")
    waiting = asyncio.create_task(log.record("e2", "e2"))
    await asyncio.sleep(0.01)
    log.detach()
    assert await asyncio.wait_for(waiting, 1) is False


async def test_bytes_bound_the_log_too_and_a_resume_sets_what_is_protected():
    log = ReplayLog(max_events=100, max_bytes=25)
    log.attach(0)
    await _record(log, "e1", "e2")
    log.handed(2)
    log.attach(1)  # a client that has only e1: e2 must stay until it is handed again
    assert await _record(log, "e3") == [True]  # e1 dropped for it
    log.detach()
    assert await _record(log, "e4") == [False]
    assert log.position_after("") is None  # the first event is gone: a client that saw nothing cannot resume


async def test_next_waits_and_ends_when_finished():
    log = ReplayLog(max_events=4, max_bytes=1000)
    log.attach(0)
    reader = asyncio.create_task(log.next(0))
    await asyncio.sleep(0.01)
    assert not reader.done()
    await log.record("e1", "x")
    assert await reader == "x"
    log.finish()
    assert await log.next(1) is None


def test_claims_are_refused_with_their_status_and_a_token_opens_its_own_session_only():
    holds = Holds()
    a, b = Hold("sess_a", ReplayLog(8, 100), 30), Hold("sess_b", ReplayLog(8, 100), 30, key_tag="tag-b")
    holds.add(a)
    holds.add(b)

    def refused(*args: str, **kw: object) -> tuple[int, str | None]:
        with pytest.raises(RealtimeError) as err:
            holds.claim(*args, **{"key_tag": None, "authorized": True, **kw})  # type: ignore[arg-type]
        return http_status(err.value), err.value.code

    assert refused("sess_x", a.token, "") == (404, "session_not_found")
    assert refused("sess_a", b.token, "") == (403, "invalid_resume_token")
    assert refused("sess_a", a.token, "event_x") == (409, "resume_gap")
    assert refused("sess_b", b.token, "", key_tag="tag-other", authorized=False) == (401, "invalid_api_key")
    assert refused("sess_a", a.token, "", key_tag="tag-b", authorized=False) == (401, "invalid_api_key")  # a's was opened with the API key
    assert holds.claim("sess_b", b.token, "", key_tag="tag-b", authorized=False) == (b, 0)
    holds.ended(a, "it was tested")
    assert refused("sess_a", a.token, "") == (410, "session_ended")
    assert refused("sess_a", b.token, "") == (404, "session_not_found")  # why it ended is told to its own client only
    assert a.token not in repr(a)
