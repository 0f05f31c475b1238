"""Outbound registration (``sip.register``): this bridge keeps itself registered with a provider's
registrar, so that a trunk that delivers an account's calls only to a registered contact sends
them here (RFC 3261 §10).

One REGISTER at start binding ``sip:user@domain`` to our Contact for ``expires_s``; a 401 or 407
is answered with digest (MD5 or SHA-256, ``admission.answer_challenge``) once per attempt; the
registrar's grant (our Contact's ``expires``, else ``Expires``) is refreshed at 80% of it. Refused
or unanswered: tried again after ``retry_s``. At stop the binding is removed (``Expires: 0``). Every
REGISTER of a run shares one Call-ID, its CSeq counting up, as the RFC asks of a registration.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Protocol

from realtime_omni.config import SipRegister

from .admission import answer_challenge
from .message import Addr, SipMessage, param, token

log = logging.getLogger(__name__)

REFRESH_SHARE = 0.8  # of the granted time, when the binding is renewed
UNREGISTER_TIMEOUT_S = 5.0


def registrar_address(registrar: str) -> tuple[str, int]:
    """``host[:port]`` (an IPv6 literal in brackets) as host and port, 5060 unless given."""
    if registrar.startswith("["):
        host, _, tail = registrar[1:].partition("]")
        return host, int(tail[1:]) if tail.startswith(":") else 5060
    host, _, port = registrar.partition(":")
    return host, int(port) if port else 5060


class Transacting(Protocol):
    """What a registration needs of the bridge: its socket's address, the address it puts in
    Contact for a peer, and a client transaction."""

    address: Addr

    def advertised(self, peer: Addr) -> str: ...

    async def transact(self, msg: SipMessage, addr: Addr) -> SipMessage | None: ...


class Registration:
    def __init__(self, bridge: Transacting, config: SipRegister) -> None:
        self.bridge = bridge
        self.config = config
        self.host, self.port = registrar_address(config.registrar)
        self.domain = config.domain or self.host
        self.call_id = f"{token(16)}@realtime-omni"
        self.tag = token()
        self.cseq = 0
        self.registered = False
        self.granted_s = 0  # what the registrar granted last (0: not registered)
        self.registrations = 0  # successful REGISTERs (the first and each refresh)
        self._addr: Addr | None = None

    @property
    def aor(self) -> str:
        return f"sip:{self.config.user}@{self.domain}"

    async def run(self) -> None:
        """Register, then keep the binding fresh, until cancelled."""
        while True:
            granted = await self._register(self.config.expires_s)
            if granted is not None and not self.registered:
                log.info("SIP: registered as %s with %s for %d s", self.aor, self.config.registrar, granted)
            self.registered = granted is not None
            if granted is None:
                await asyncio.sleep(self.config.retry_s)
                continue
            self.granted_s = granted
            self.registrations += 1
            await asyncio.sleep(max(1.0, granted * REFRESH_SHARE))

    async def unregister(self) -> None:
        """Remove our binding (best effort: a registrar that does not answer lets it expire)."""
        if not self.registered:
            return
        self.registered = False
        try:
            async with asyncio.timeout(UNREGISTER_TIMEOUT_S):
                await self._register(0)
        except TimeoutError:
            log.warning("SIP registrar %s did not answer the unregistration; the binding expires by itself", self.config.registrar)

    async def _resolve(self) -> Addr:
        if self._addr is None:
            infos = await asyncio.get_running_loop().getaddrinfo(self.host, self.port, type=socket.SOCK_DGRAM, family=socket.AF_INET)
            self._addr = (str(infos[0][4][0]), int(infos[0][4][1]))
        return self._addr

    def _request(self, addr: Addr, expires: int, authorization: tuple[str, str] | None) -> SipMessage:
        self.cseq += 1
        host, port = self.bridge.advertised(addr), self.bridge.address[1]
        headers = [
            ("Via", f"SIP/2.0/UDP {host}:{port};branch=z9hG4bK{token(16)};rport"),
            ("Max-Forwards", "70"),
            ("From", f"<{self.aor}>;tag={self.tag}"),
            ("To", f"<{self.aor}>"),
            ("Call-ID", self.call_id),
            ("CSeq", f"{self.cseq} REGISTER"),
            ("Contact", f"<sip:{self.config.user}@{host}:{port}>"),
            ("Expires", str(expires)),
            ("User-Agent", "realtime-omni"),
            *([authorization] if authorization else []),
        ]
        return SipMessage(method="REGISTER", uri=f"sip:{self.domain}", headers=headers)

    async def _register(self, expires: int) -> int | None:
        """One registration (``expires`` 0: removal), a challenge answered; the seconds granted, or
        None when it failed (logged)."""
        try:
            addr = await self._resolve()
        except OSError as exc:
            log.warning("SIP registrar %s: cannot resolve it (%s); trying again in %g s", self.config.registrar, exc, self.config.retry_s)
            return None
        authorization: tuple[str, str] | None = None
        for _ in range(2):  # the request, and once more answering its challenge
            answer = await self.bridge.transact(self._request(addr, expires, authorization), addr)
            if answer is None:
                log.warning("SIP registrar %s did not answer REGISTER; trying again in %g s", self.config.registrar, self.config.retry_s)
                return None
            if answer.status in (401, 407) and authorization is None:
                challenge, header = ("WWW-Authenticate", "Authorization") if answer.status == 401 else ("Proxy-Authenticate", "Proxy-Authorization")
                value = answer_challenge(answer.get_all(challenge), "REGISTER", f"sip:{self.domain}", self.config.auth_user or self.config.user, self.config.password)
                if value is None:
                    log.warning("SIP registrar %s asks for an authentication this bridge cannot give (%s)", self.config.registrar, answer.get(challenge))
                    return None
                authorization = (header, value)
                continue
            if 200 <= answer.status < 300:
                return self._granted(answer, expires)
            log.warning("SIP registrar %s refused REGISTER: %d %s; trying again in %g s", self.config.registrar, answer.status, answer.reason, self.config.retry_s)
            return None
        return None

    def _granted(self, answer: SipMessage, asked: int) -> int:
        """The seconds the registrar granted our Contact (RFC 3261 §10.2.4: the Contact's ``expires``,
        else the ``Expires`` header, else what we asked)."""
        ours = f"sip:{self.config.user}@"
        for contact in answer.get_all("Contact"):
            for one in contact.split(","):
                if ours in one and (value := param(one, "expires")) is not None and value.isdigit():
                    return int(value)
        header = answer.get("Expires")
        return int(header) if header is not None and header.strip().isdigit() else asked
