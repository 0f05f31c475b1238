"""``SipCall``'s states, walked on real calls: a bare caller over UDP (``RawUac``) and the real
bridge, with a webhook so each call waits, ringing, for the test to accept, reject or hang it up
over HTTP. Every path of ``CALL_MOVES`` a call can take is taken, each ending in ``ended``, and a
move the table does not list is refused: among them the one a CANCEL racing an accept used to
make (ended -> answered, with a 200 after the 487)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from realtime_omni.errors import RealtimeError
from realtime_omni.protocol import events as ev
from realtime_omni.states import IllegalMove
from tests.conftest import synthetic_config
from tests.support.server import ServerThread
from tests.support.sip import RawUac, WebhookReceiver, free_udp_port, sdp_offer, wait_until
from transports.sip.call import CALL_MOVES, CallState, SipCall
from transports.sip.message import param

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def bridge(webhook: WebhookReceiver) -> Any:
    config = synthetic_config(server={"api_key": "test-key"})
    config["sip"] = {"port": 0, "webhook_url": webhook.url, "t1_ms": 100}
    srv = ServerThread(config).start()
    yield srv
    srv.stop()


async def ringing(bridge: ServerThread, webhook: WebhookReceiver, uac: RawUac, sip_call_id: str) -> SipCall:
    """INVITE (its branch ``z9hG4bK-<Call-ID>``, for a CANCEL to name); the call once the webhook
    has heard of it (ringing)."""
    uac.send(uac.request("INVITE", sip_call_id, branch=f"z9hG4bK-{sip_call_id}", body=sdp_offer(free_udp_port())))
    call_id = (await webhook.next())["data"]["call_id"]
    call = bridge.call(lambda: bridge.server.calls[call_id])
    assert isinstance(call, SipCall) and call.state is CallState.RINGING
    return call


async def control(bridge: ServerThread, call: SipCall, action: str, body: dict[str, Any] | None = None) -> httpx.Response:
    async with httpx.AsyncClient(base_url=bridge.http_url, headers={"Authorization": "Bearer test-key"}) as http:
        return await http.post(f"/v1/realtime/calls/{call.id}/{action}", json=body or {})


def refused(bridge: ServerThread, call: SipCall, to: CallState) -> bool:
    """Whether the call's setter refuses ``to`` now (run on the server's loop, as every move is)."""

    def attempt() -> bool:
        try:
            call._move(to)
        except IllegalMove:
            return True
        return False

    return bridge.call(attempt)


def nothing_left(bridge: ServerThread) -> bool:
    return bridge.call(lambda: not bridge.server.calls and not bridge.app.state.sip.calls and not bridge.server.sessions)


def test_the_table_lets_every_state_end_and_nothing_leave_ended() -> None:
    for state in CallState:
        assert state is CallState.ENDED or CallState.ENDED in CALL_MOVES[state]
    assert not CALL_MOVES[CallState.ENDED]
    assert CALL_MOVES[CallState.ANSWERED] == {CallState.ENDED}  # an answered call never goes back


async def test_ringing_accepting_answered_ended(bridge: ServerThread, webhook: WebhookReceiver, uac: RawUac) -> None:
    call = await ringing(bridge, webhook, uac, "states-answer")
    assert refused(bridge, call, CallState.ANSWERED)  # not without accepting first
    assert (await control(bridge, call, "accept")).status_code == 200
    assert call.state is CallState.ANSWERED
    ok = uac.final("states-answer")
    assert ok is not None and ok.status == 200
    assert (await control(bridge, call, "accept")).status_code == 409  # answered: not ringing
    assert refused(bridge, call, CallState.RINGING) and refused(bridge, call, CallState.REJECTED)
    tag = param(ok.get("To"), "tag")
    uac.send(uac.request("ACK", "states-answer", to_tag=tag))
    uac.send(uac.request("BYE", "states-answer", cseq=2, to_tag=tag))
    assert (bye := uac.final("states-answer", "BYE")) is not None and bye.status == 200
    await bridge.acall(lambda: call.ended.wait())
    assert call.state is CallState.ENDED and refused(bridge, call, CallState.ANSWERED)
    assert await wait_until(lambda: nothing_left(bridge))


@pytest.mark.parametrize(
    ("how", "status"),
    [("reject", 603), ("cancel", 487), ("hangup", 603)],
    ids=["ringing-rejected-ended", "ringing-cancelled-ended", "ringing-ended"],
)
async def test_a_call_ended_before_its_answer(bridge: ServerThread, webhook: WebhookReceiver, uac: RawUac, how: str, status: int) -> None:
    sip_call_id = f"states-{how}"
    call = await ringing(bridge, webhook, uac, sip_call_id)
    if how == "cancel":
        uac.send(uac.request("CANCEL", sip_call_id, branch=f"z9hG4bK-{sip_call_id}"))  # the INVITE's transaction
    else:
        assert (await control(bridge, call, how)).status_code == 200
    final = uac.final(sip_call_id)
    assert final is not None and final.status == status
    await bridge.acall(lambda: call.ended.wait())
    assert call.state is CallState.ENDED
    assert refused(bridge, call, CallState.ACCEPTING) and refused(bridge, call, CallState.RINGING)
    assert await wait_until(lambda: nothing_left(bridge))


async def test_a_cancel_while_the_call_is_being_accepted_ends_it_and_the_accept_fails(
    bridge: ServerThread, webhook: WebhookReceiver, uac: RawUac
) -> None:
    """The accept opens the call's RTP socket (a wait); a CANCEL handled meanwhile ends the call.
    The accept then finds it no longer accepting: it fails, closes the socket it opened, and
    sends no 200 after the 487."""
    call = await ringing(bridge, webhook, uac, "states-race")

    async def race() -> tuple[str | None, CallState, bool]:
        accepting = asyncio.ensure_future(call.accept(ev.SessionObject()))
        while call.state is not CallState.ACCEPTING:  # the accept has begun, and waits on its socket
            await asyncio.sleep(0)
        await call.cancelled()
        try:
            await accepting
        except RealtimeError as err:
            assert call.endpoint is not None and call.endpoint.transport is not None
            return err.code, call.state, call.endpoint.transport.is_closing()
        raise AssertionError("the accept of a cancelled call succeeded")

    code, state, socket_closed = await bridge.acall(race)
    assert (code, state, socket_closed) == ("call_state", CallState.ENDED, True)
    # Everything the bridge sent for this call left before the race returned; an OPTIONS answered
    # after it shows that all of it has arrived.
    uac.send(uac.request("OPTIONS", "states-race-probe"))
    assert uac.final("states-race-probe", "OPTIONS") is not None
    answers = [m.status for m in uac.inbox if m.call_id == "states-race" and m.cseq[1] == "INVITE" and m.status >= 200]
    assert answers and set(answers) == {487}  # (the 487 may be resent until an ACK)
    assert await wait_until(lambda: nothing_left(bridge))
