"""The RFC 3261 17 transaction state machines, state by state, with an explicit clock: what each
input makes them send, when their next timer is due, and how they end. No sockets, no sleeping."""

from __future__ import annotations

import pytest

from transports.sip.message import SipMessage, parse, response
from transports.sip.transaction import (
    Answered,
    ClientTransaction,
    Send,
    ServerTransaction,
    State,
    TimedOut,
    transaction_key,
)

T1, T2, T4 = 0.5, 4.0, 5.0
PEER = ("192.0.2.1", 5060)


def request(method: str = "INVITE", branch: str = "z9hG4bKabc", cseq: int = 1) -> SipMessage:
    return parse(
        (
            f"{method} sip:agent@192.0.2.9 SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 192.0.2.1:5060;branch={branch}\r\n"
            "From: <sip:caller@192.0.2.1>;tag=caller\r\n"
            "To: <sip:agent@192.0.2.9>\r\n"
            "Call-ID: tx-test\r\n"
            f"CSeq: {cseq} {method}\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode()
    )


def server(method: str = "INVITE") -> tuple[ServerTransaction, SipMessage]:
    msg = request(method)
    return ServerTransaction(transaction_key(msg), PEER, method, t1=T1, t2=T2, t4=T4), msg


def run_timers(tx: ServerTransaction | ClientTransaction, until: float) -> list[tuple[float, object]]:
    """Fire every timer due before ``until``, exactly at its deadline; what came out, and when."""
    seen: list[tuple[float, object]] = []
    while tx.deadline is not None and tx.deadline <= until:
        now = tx.deadline
        seen.extend((now, out) for out in tx.on_timer(now))
    return seen


def sent(data: SipMessage) -> Send:
    return Send(data.encode())


# ---------------------------------------------------------------- matching


def test_the_ack_for_a_non_2xx_matches_the_invite_transaction_and_other_methods_do_not() -> None:
    invite = request("INVITE")
    assert transaction_key(request("ACK")) == transaction_key(invite)
    assert transaction_key(request("BYE")) != transaction_key(invite)
    assert transaction_key(request("INVITE", branch="z9hG4bKother")) != transaction_key(invite)


def test_a_peer_without_the_magic_cookie_is_matched_on_call_id_tag_and_cseq() -> None:
    old = request("INVITE", branch="1234")
    assert transaction_key(old) == ("tx-test", "caller", "1", "INVITE")
    assert transaction_key(request("INVITE", branch="5678")) == transaction_key(old)
    assert transaction_key(request("INVITE", branch="1234", cseq=2)) != transaction_key(old)


# ---------------------------------------------------------------- INVITE server transaction (17.2.1)


def test_invite_starts_in_proceeding_with_no_timer_and_a_retransmission_before_any_response_is_absorbed() -> None:
    tx, _ = server("INVITE")
    assert tx.state is State.PROCEEDING
    assert tx.deadline is None
    assert tx.on_request(now=0.1) == []


def test_invite_proceeding_a_retransmission_gets_the_last_provisional_response() -> None:
    tx, invite = server("INVITE")
    trying, ringing = response(invite, 100), response(invite, 180, to_tag="us")
    assert tx.respond(trying, now=0.0) == [sent(trying)]
    assert tx.respond(ringing, now=0.05) == [sent(ringing)]
    assert tx.state is State.PROCEEDING
    assert tx.deadline is None  # provisional responses are not retransmitted over UDP by the transaction
    assert tx.on_request(now=1.0) == [sent(ringing)]
    assert tx.final == 0


def test_invite_non_2xx_final_goes_to_completed_and_timer_g_doubles_up_to_t2() -> None:
    tx, invite = server("INVITE")
    busy = response(invite, 486, to_tag="us")
    assert tx.respond(busy, now=10.0) == [sent(busy)]
    assert tx.state is State.COMPLETED and tx.final == 486
    assert tx.deadline == pytest.approx(10.0 + T1)
    assert tx.on_timer(now=10.0 + T1 / 2) == []  # early: nothing

    fired = run_timers(tx, until=10.0 + 30.0)
    times = [round(at - 10.0, 6) for at, out in fired if out == sent(busy)]
    # T1, then 2T1, 4T1, 8T1 capped at T2 (4 s): 0.5, 1.5, 3.5, 7.5, 11.5, ...
    assert times[:6] == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert max(gaps) == pytest.approx(T2)
    assert tx.state is State.COMPLETED


def test_invite_completed_retransmitted_invite_gets_the_final_response_again() -> None:
    tx, invite = server("INVITE")
    tx.respond(response(invite, 100), now=0.0)
    busy = response(invite, 486, to_tag="us")
    tx.respond(busy, now=0.1)
    assert tx.on_request(now=0.2) == [sent(busy)]


def test_invite_completed_ack_moves_to_confirmed_stops_timer_g_and_timer_i_terminates() -> None:
    tx, invite = server("INVITE")
    busy = response(invite, 486, to_tag="us")
    tx.respond(busy, now=0.0)
    assert tx.on_ack(now=0.7) == []  # an ACK is never answered
    assert tx.state is State.CONFIRMED and tx.acked
    assert tx.deadline == pytest.approx(0.7 + T4)  # Timer I only: no more retransmissions
    assert tx.on_ack(now=0.8) == []  # a retransmitted ACK is absorbed
    assert tx.deadline == pytest.approx(0.7 + T4)
    assert tx.on_timer(now=0.7 + T4) == []  # ends quietly
    assert tx.state is State.TERMINATED and tx.terminated
    assert tx.deadline is None


def test_invite_completed_without_ack_timer_h_reports_the_failure_at_64_t1() -> None:
    tx, invite = server("INVITE")
    busy = response(invite, 486, to_tag="us")
    tx.respond(busy, now=0.0)
    fired = run_timers(tx, until=100.0)
    at, last = fired[-1]
    assert last == TimedOut(486)
    assert at == pytest.approx(64 * T1)
    assert all(out == sent(busy) for _, out in fired[:-1])
    assert all(t < 64 * T1 for t, _ in fired[:-1])
    assert tx.state is State.TERMINATED and tx.deadline is None
    assert tx.on_request(now=40.0) == []  # a terminated transaction answers nothing


def test_invite_2xx_goes_to_accepted_and_is_resent_at_t1_2t1_4t1_capped_at_t2() -> None:
    tx, invite = server("INVITE")
    ok = response(invite, 200, to_tag="us", body=b"v=0\r\n")
    assert tx.respond(ok, now=0.0) == [sent(ok)]
    assert tx.state is State.ACCEPTED and tx.final == 200
    fired = run_timers(tx, until=20.0)
    times = [round(at, 6) for at, out in fired if out == sent(ok)]
    assert times[:5] == [0.5, 1.5, 3.5, 7.5, 11.5]
    assert tx.on_request(now=20.0) == [sent(ok)]  # a retransmitted INVITE gets the 2xx


def test_invite_accepted_ack_stops_the_2xx_but_the_transaction_stays_until_timer_l() -> None:
    tx, invite = server("INVITE")
    ok = response(invite, 200, to_tag="us")
    tx.respond(ok, now=0.0)
    assert tx.on_timer(now=T1) == [sent(ok)]
    assert tx.on_ack(now=0.6) == []
    assert tx.acked and tx.state is State.ACCEPTED
    assert tx.deadline == pytest.approx(64 * T1)  # Timer L only: no retransmission is due any more
    assert tx.on_request(now=1.0) == [sent(ok)]
    assert tx.on_timer(now=64 * T1) == []  # acknowledged: ends without a failure
    assert tx.state is State.TERMINATED


def test_invite_accepted_without_ack_reports_the_unconfirmed_2xx_at_64_t1() -> None:
    tx, invite = server("INVITE")
    tx.respond(response(invite, 200, to_tag="us"), now=3.0)
    before = run_timers(tx, until=3.0 + 64 * T1 - 0.01)
    assert before and all(isinstance(out, Send) for _, out in before)
    assert tx.state is State.ACCEPTED
    assert tx.on_timer(now=3.0 + 64 * T1) == [TimedOut(200)]
    assert tx.state is State.TERMINATED


def test_invite_a_response_after_the_final_one_is_sent_and_resent_but_moves_no_timer() -> None:
    tx, invite = server("INVITE")
    cancelled = response(invite, 487, to_tag="us")
    tx.respond(cancelled, now=0.0)
    deadline = tx.deadline
    late = response(invite, 603, to_tag="us")
    assert tx.respond(late, now=0.1) == [sent(late)]
    assert tx.final == 487 and tx.state is State.COMPLETED
    assert tx.deadline == deadline
    assert tx.on_timer(now=T1) == [sent(late)]


def test_invite_ack_before_any_final_response_is_ignored() -> None:
    tx, invite = server("INVITE")
    tx.respond(response(invite, 180, to_tag="us"), now=0.0)
    assert tx.on_ack(now=0.1) == []
    assert tx.state is State.PROCEEDING and not tx.acked


# ---------------------------------------------------------------- non-INVITE server transaction (17.2.2)


def test_non_invite_trying_absorbs_a_retransmission_before_the_first_response() -> None:
    tx, _ = server("BYE")
    assert tx.state is State.TRYING and tx.deadline is None
    assert tx.on_request(now=0.1) == []


def test_non_invite_proceeding_retransmission_gets_the_provisional_response() -> None:
    tx, bye = server("BYE")
    trying = response(bye, 100)
    assert tx.respond(trying, now=0.0) == [sent(trying)]
    assert tx.state is State.PROCEEDING and tx.deadline is None
    assert tx.on_request(now=0.2) == [sent(trying)]


def test_non_invite_completed_answers_each_retransmission_with_the_same_final_response_and_never_resends_alone() -> None:
    tx, bye = server("BYE")
    ok = response(bye, 200)
    assert tx.respond(ok, now=1.0) == [sent(ok)]
    assert tx.state is State.COMPLETED and tx.final == 200
    assert tx.on_request(now=1.5) == [sent(ok)]
    assert tx.on_request(now=9.0) == [sent(ok)]
    assert tx.deadline == pytest.approx(1.0 + 64 * T1)  # Timer J is the only timer
    assert tx.on_timer(now=20.0) == []


def test_non_invite_timer_j_terminates_quietly_and_ignores_an_ack() -> None:
    tx, options = server("OPTIONS")
    ok = response(options, 200)
    tx.respond(ok, now=0.0)
    assert tx.on_ack(now=0.1) == [] and not tx.acked
    assert tx.on_timer(now=64 * T1) == []
    assert tx.state is State.TERMINATED and tx.deadline is None
    assert tx.on_request(now=64 * T1 + 1) == []


# ---------------------------------------------------------------- non-INVITE client transaction (17.1.2)


def client() -> ClientTransaction:
    return ClientTransaction(request("BYE", branch="z9hG4bKours"), PEER, t1=T1, t2=T2, t4=T4)


def test_client_trying_sends_at_once_and_timer_e_doubles_up_to_t2() -> None:
    tx = client()
    assert tx.start(now=0.0) == [Send(tx.data)]
    assert tx.state is State.TRYING and tx.branch == "z9hG4bKours"
    fired = run_timers(tx, until=20.0)
    times = [round(at, 6) for at, out in fired if out == Send(tx.data)]
    assert times[:6] == [0.5, 1.5, 3.5, 7.5, 11.5, 15.5]


def test_client_proceeding_after_a_provisional_resends_every_t2() -> None:
    tx = client()
    tx.start(now=0.0)
    assert tx.on_timer(now=T1) == [Send(tx.data)]
    assert tx.on_response(response(tx.request, 100), now=0.6) == []
    assert tx.state is State.PROCEEDING
    fired = run_timers(tx, until=12.0)
    times = [round(at, 6) for at, out in fired if out == Send(tx.data)]
    assert times == [1.5, 5.5, 9.5]  # the pending Timer E, then T2 apart


def test_client_final_response_is_answered_once_and_timer_k_terminates() -> None:
    tx = client()
    tx.start(now=0.0)
    ok = response(tx.request, 200)
    assert tx.on_response(ok, now=0.2) == [Answered(ok)]
    assert tx.state is State.COMPLETED and tx.response is ok
    assert tx.deadline == pytest.approx(0.2 + T4)  # no more retransmissions
    assert tx.on_response(ok, now=0.3) == []  # a retransmitted response is absorbed
    assert tx.on_timer(now=0.2 + T4) == []
    assert tx.state is State.TERMINATED


def test_client_without_a_final_response_timer_f_reports_the_failure_at_64_t1() -> None:
    tx = client()
    tx.start(now=0.0)
    fired = run_timers(tx, until=100.0)
    assert fired[-1] == (pytest.approx(64 * T1), TimedOut(0))
    assert all(out == Send(tx.data) for _, out in fired[:-1])
    assert tx.state is State.TERMINATED and tx.deadline is None
    assert tx.on_response(response(tx.request, 200), now=40.0) == []
