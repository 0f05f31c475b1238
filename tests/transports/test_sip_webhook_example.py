"""deploy/sip_webhook.py, the webhook docs/telephony.md gives, run as its own process in front of a
real server's SIP bridge: a call from a listed number is accepted with its session, another is
rejected with 403."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any


from tests.conftest import synthetic_config
from tests.support.ports import reserved_port
from tests.support.server import ServerThread
from tests.support.sip import RawUac, free_udp_port, sdp_offer, wait_until

ROOT = Path(__file__).parents[2]
KEY = "sk-webhook-example"


def invite_from(uac: RawUac, call_id: str, caller: str) -> Any:
    request = uac.request("INVITE", call_id, body=sdp_offer(free_udp_port()))
    uac.send(request.replace("From: <sip:uac@127.0.0.1>", f"From: <sip:{caller}@trunk.example>"))
    return uac.final(call_id, timeout=10)


async def test_the_documented_webhook_accepts_listed_callers_and_rejects_others():
    port, held = reserved_port()
    held.close()  # the example binds it itself
    config = synthetic_config(server={"api_key": KEY})
    config["sip"] = {"port": 0, "webhook_url": f"http://127.0.0.1:{port}/"}
    server = ServerThread(config).start()
    env = {**os.environ, "REALTIME_OMNI_URL": server.http_url, "REALTIME_OMNI_API_KEY": KEY, "ALLOWED_CALLERS": "+15551234567"}
    hook = subprocess.Popen([sys.executable, str(ROOT / "deploy" / "sip_webhook.py"), "--port", str(port)], env=env, stdout=subprocess.PIPE, text=True)
    uac = RawUac(tuple(server.app.state.sip.address))
    try:
        assert "webhook on" in (hook.stdout.readline() if hook.stdout else "")
        accepted = invite_from(uac, "hook-1", "+15551234567")
        assert accepted is not None and accepted.status == 200, accepted and accepted.status
        tag = (accepted.get("To") or "").split("tag=", 1)[1]
        uac.send(uac.request("ACK", "hook-1", to_tag=tag))
        instructions = server.call(lambda: [s.config.wire.instructions for s in server.server.sessions])
        assert instructions and "Example Ltd" in instructions[0]  # the webhook's session, laid over sip.session
        uac.send(uac.request("BYE", "hook-1", cseq=2, to_tag=tag))

        refused = invite_from(uac, "hook-2", "+15550000000")
        assert refused is not None and refused.status == 403
        assert await wait_until(lambda: server.call(lambda: not server.server.sessions and not server.app.state.sip.calls))
    finally:
        uac.close()
        hook.terminate()
        hook.wait(10)
        server.stop()
