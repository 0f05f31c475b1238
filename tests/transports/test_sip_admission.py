"""Who may call, with real callers: sipp answers the bridge's digest challenge with right and wrong
passwords (MD5, as sipp computes it), a bare UDP caller answers it with SHA-256 and replays an
answer, a source not listed gets 403, and a bridge on a public address with neither says so."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import synthetic_config
from tests.support.server import ServerThread
from tests.support.sip import SIPP, RawUac, authenticated_scenario, free_udp_port, invite_scenario, sdp_offer, sipp, wait_until
from transports.sip.admission import digest_params, digest_response

pytestmark = [pytest.mark.timeout(120)]

USER, PASSWORD = "trunk-1", "correct horse"


def sip_server(**sip: Any) -> ServerThread:
    config = synthetic_config()
    config["sip"] = {"port": 0, "rtp_timeout_s": 10.0, **sip}
    return ServerThread(config).start()


def target(server: ServerThread) -> str:
    host, port = server.app.state.sip.address
    return f"{host}:{port}"


def no_calls_left(server: ServerThread) -> bool:
    return server.call(lambda: not server.server.calls and not server.app.state.sip.calls and not server.server.sessions)


def need_sipp() -> None:
    if SIPP is None:
        pytest.fail("sipp is required (apt-get install sip-tester)")


@pytest.mark.system
async def test_sipp_answers_the_md5_challenge_and_a_wrong_password_is_refused(tmp_path: Path) -> None:
    need_sipp()
    server = sip_server(credentials={USER: PASSWORD}, digest_algorithms=["MD5"])
    try:
        right = sipp(authenticated_scenario(free_udp_port()), target(server), tmp_path, extra=["-au", USER, "-ap", PASSWORD])
        assert right.returncode == 0, right.stdout[-2000:]
        wrong = sipp(authenticated_scenario(free_udp_port(), expect="403"), target(server), tmp_path, extra=["-au", USER, "-ap", "wrong horse"])
        assert wrong.returncode == 0, wrong.stdout[-2000:]
        stranger = sipp(authenticated_scenario(free_udp_port(), expect="403"), target(server), tmp_path, extra=["-au", "nobody", "-ap", PASSWORD])
        assert stranger.returncode == 0, stranger.stdout[-2000:]
        # a caller that ignores the challenge gets it, and no call
        bare = sipp(invite_scenario(free_udp_port(), expect="401"), target(server), tmp_path)
        assert bare.returncode == 0, bare.stdout[-2000:]
        assert await wait_until(lambda: no_calls_left(server))
        assert server.call(lambda: server.app.state.sip.stats["refused"]) == 2
    finally:
        server.stop()


@pytest.mark.system
async def test_a_source_not_listed_gets_403_and_a_listed_one_is_answered(tmp_path: Path) -> None:
    need_sipp()
    elsewhere = sip_server(allowed_sources=["192.0.2.0/24", "2001:db8::/32"])
    here = sip_server(allowed_sources=["10.0.0.0/8", "127.0.0.1/32"])
    try:
        refused = sipp(invite_scenario(free_udp_port(), expect="403"), target(elsewhere), tmp_path)
        assert refused.returncode == 0, refused.stdout[-2000:]
        answered = sipp(invite_scenario(free_udp_port()), target(here), tmp_path)
        assert answered.returncode == 0, answered.stdout[-2000:]
        assert await wait_until(lambda: no_calls_left(here))
        assert elsewhere.call(lambda: (len(elsewhere.server.sessions), elsewhere.app.state.sip.stats["refused"])) == (0, 1)
    finally:
        elsewhere.stop()
        here.stop()


def challenge(uac: RawUac, call_id: str, cseq: int, extra: str = "") -> Any:
    uac.send(uac.request("INVITE", call_id, cseq=cseq, body=sdp_offer(free_udp_port()), extra=extra))
    return uac.final(call_id)


def answer(uac: RawUac, server: ServerThread, params: dict[str, str], nc: str, *, password: str = PASSWORD, algorithm: str = "SHA-256") -> str:
    uri = f"sip:agent@{target(server)}"
    cnonce = "0a4f113b"
    digest = digest_response(algorithm, USER, params["realm"], password, "INVITE", uri, params["nonce"], nc, cnonce, "auth")
    return (f'Authorization: Digest username="{USER}", realm="{params["realm"]}", nonce="{params["nonce"]}", uri="{uri}", '
            f'response="{digest}", algorithm={algorithm}, cnonce="{cnonce}", qop=auth, nc={nc}\r\n')


def ack(uac: RawUac, final: Any, call_id: str, cseq: int) -> None:
    """The ACK of a non-2xx final answer (its transaction's branch), so the answer is not resent."""
    via = final.get("Via") or ""
    branch = via.split("branch=", 1)[1].split(";", 1)[0]
    uac.send(uac.request("ACK", call_id, cseq=cseq, branch=branch, to_tag=to_tag(final)))


def to_tag(final: Any) -> str:
    return (final.get("To") or "").split("tag=", 1)[1]


async def test_sha256_digest_admits_once_and_a_replayed_answer_is_challenged_again() -> None:
    server = sip_server(credentials={USER: PASSWORD})  # SHA-256 offered first, then MD5
    uac = RawUac(tuple(server.app.state.sip.address))
    try:
        first = challenge(uac, "auth-1", 1)
        assert first is not None and first.status == 401 and first.reason == "Unauthorized"
        offered = [digest_params(h) for h in first.get_all("WWW-Authenticate")]
        assert [p["algorithm"] for p in offered if p] == ["SHA-256", "MD5"]
        params = offered[0]
        assert params is not None and params["realm"] == "realtime-omni" and params["qop"] == "auth" and "stale" not in params
        ack(uac, first, "auth-1", 1)

        admitted = challenge(uac, "auth-1", 2, answer(uac, server, params, "00000001"))
        assert admitted is not None and admitted.status == 200, admitted and (admitted.status, admitted.reason)
        assert await wait_until(lambda: server.call(lambda: len(server.server.sessions)) == 1)
        uac.send(uac.request("ACK", "auth-1", cseq=2, to_tag=to_tag(admitted)))
        uac.send(uac.request("BYE", "auth-1", cseq=3, to_tag=to_tag(admitted)))
        assert await wait_until(lambda: no_calls_left(server))

        # the same answer (nonce and count) on another call: a replay, asked again with stale=true
        replayed = challenge(uac, "auth-2", 1, answer(uac, server, params, "00000001"))
        assert replayed is not None and replayed.status == 401
        again = digest_params(replayed.get_all("WWW-Authenticate")[0])
        assert again is not None and again["stale"] == "true" and again["nonce"] != params["nonce"]
        ack(uac, replayed, "auth-2", 1)
        # the same nonce with the next count is the caller's own next use of it: admitted
        next_use = challenge(uac, "auth-3", 1, answer(uac, server, params, "00000002"))
        assert next_use is not None and next_use.status == 200
        uac.send(uac.request("ACK", "auth-3", cseq=1, to_tag=to_tag(next_use)))
        uac.send(uac.request("BYE", "auth-3", cseq=2, to_tag=to_tag(next_use)))
        # a nonce the server never issued: asked again; a wrong password: 403
        forged = challenge(uac, "auth-4", 1, answer(uac, server, {**params, "nonce": "f" * 32}, "00000001"))
        assert forged is not None and forged.status == 401
        ack(uac, forged, "auth-4", 1)
        wrong = challenge(uac, "auth-5", 1, answer(uac, server, params, "00000003", password="wrong"))
        assert wrong is not None and wrong.status == 403
        ack(uac, wrong, "auth-5", 1)
        # in-dialog requests of an admitted call are not challenged; OPTIONS probes neither
        uac.send(uac.request("OPTIONS", "probe-1"))
        probe = uac.final("probe-1", "OPTIONS")
        assert probe is not None and probe.status == 200
        assert await wait_until(lambda: no_calls_left(server))
    finally:
        uac.close()
        server.stop()


def test_a_bridge_on_a_public_address_open_to_anyone_says_so(caplog: pytest.LogCaptureFixture) -> None:
    warning = "takes calls from anyone"
    for sip, warned in (
        ({"host": "0.0.0.0"}, True),
        ({"host": "0.0.0.0", "allowed_sources": ["203.0.113.0/24"]}, False),
        ({"host": "0.0.0.0", "credentials": {USER: PASSWORD}}, False),
        ({"host": "127.0.0.1"}, False),
    ):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="transports.sip.bridge"):
            server = sip_server(**sip)
            server.stop()
        assert any(warning in r.getMessage() for r in caplog.records) == warned, sip


def test_a_bad_source_block_or_algorithm_list_is_a_config_error() -> None:
    from realtime_omni import config as config_file

    for sip, key in (({"allowed_sources": ["10.0.0.300/8"]}, "sip"), ({"digest_algorithms": []}, "sip"), ({"digest_algorithms": ["SHA-512"]}, "sip.digest_algorithms"),
                     ({"register": {"registrar": "192.0.2.7", "user": "agent", "expires_s": 0}}, "sip.register"),
                     ({"register": {"user": "agent"}}, "sip.register.registrar")):
        with pytest.raises(config_file.ConfigError) as err:
            config_file.from_dict({"pipeline": {"kind": "synthetic"}, "sip": sip})
        assert err.value.key.startswith(key), (sip, str(err.value))


def test_our_own_answer_to_a_challenge_passes_the_bridge_check_in_either_algorithm() -> None:
    """The registrar side (answer_challenge, used by sip.register) against the caller side
    (Admission): SHA-256 and MD5, qop=auth, and a challenge without qop (RFC 2069's form)."""
    from realtime_omni.config import SipConfig
    from transports.sip.admission import Admission, answer_challenge
    from transports.sip.message import SipMessage

    def invite(authorization: str | None) -> SipMessage:
        headers = [("Via", "SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKx"), ("From", "<sip:a@b>;tag=1"), ("To", "<sip:agent@c>"), ("Call-ID", "x"), ("CSeq", "1 INVITE")]
        return SipMessage(method="INVITE", uri="sip:agent@c", headers=headers + ([("Authorization", authorization)] if authorization else []))

    for algorithms in (["SHA-256"], ["MD5"]):
        admission = Admission(SipConfig(credentials={USER: PASSWORD}, digest_algorithms=algorithms))  # type: ignore[arg-type]
        challenge = admission.refusal(invite(None))
        assert challenge is not None and challenge.status == 401
        answer = answer_challenge(challenge.get_all("WWW-Authenticate"), "INVITE", "sip:agent@c", USER, PASSWORD)
        assert answer is not None and f"algorithm={algorithms[0]}" in answer
        assert admission.refusal(invite(answer)) is None
        wrong = answer_challenge(admission.refusal(invite(None)).get_all("WWW-Authenticate"), "INVITE", "sip:agent@c", USER, "nope")  # type: ignore[union-attr]
        assert admission.refusal(invite(wrong)).status == 403  # type: ignore[union-attr]
    no_qop = 'Digest realm="r", nonce="abc", algorithm=MD5'
    answer = answer_challenge([no_qop], "REGISTER", "sip:d", "u", "p")
    assert answer is not None and "qop" not in answer
    params = digest_params(answer)
    assert params is not None and params["response"] == digest_response("MD5", "u", "r", "p", "REGISTER", "sip:d", "abc", None, None, None)
    assert answer_challenge(['Digest realm="r", nonce="abc", algorithm=SHA-512'], "REGISTER", "sip:d", "u", "p") is None
