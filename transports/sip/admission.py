"""Who may call: the source allow-list and digest authentication of the INVITEs that open calls.

The API key does not reach SIP, so without these a bridge bound to a public address answers
every SIP scanner on the Internet (and spends the agent's CPU on it).

* ``sip.allowed_sources`` (CIDRs): a request from any other address gets 403 (an ACK, never
  answered, is dropped). For a trunk that sends its calls from known addresses.
* ``sip.credentials`` (user: password): an INVITE opening a call must carry ``Authorization``
  answering our challenge (RFC 3261 §22, digest as in RFC 7616 with RFC 8760's algorithms for SIP).
  Without one: 401 and one ``WWW-Authenticate`` per algorithm of ``sip.digest_algorithms`` (the
  caller answers the first it knows), ``qop="auth"``. A right answer is admitted; a wrong user or
  password, or an algorithm not offered, gets 403. A nonce we did not issue (or no longer hold),
  older than ``NONCE_LIFETIME_S``, or a nonce count not above the last one used gets a fresh 401 with
  ``stale=true``: a caller holding the right password retries at once, a replayed answer does not
  pass. In-dialog requests (re-INVITE, BYE) belong to a call already admitted and are not challenged.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from realtime_omni.config import SipConfig

from .message import SipMessage, response, token

NONCE_LIFETIME_S = 300.0
MAX_NONCES = 1024  # challenges outstanding; the oldest is forgotten first (its caller is asked again)
HASHES = {"MD5": hashlib.md5, "SHA-256": hashlib.sha256}
DIGEST_PARAM = re.compile(r'([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))')


@dataclass
class Nonce:
    issued: float
    last_count: int = 0  # the highest nonce count (nc) answered with it


def digest_params(header: str) -> dict[str, str] | None:
    """The parameters of a ``Digest ...`` credentials header (names lowercased); None if it is
    not digest."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "digest":
        return None
    return {m[1].lower(): m[2] if m[2] else m[3] for m in DIGEST_PARAM.finditer(rest)}


def digest_response(algorithm: str, user: str, realm: str, password: str, method: str, uri: str, nonce: str, nc: str | None, cnonce: str | None, qop: str | None) -> str:
    """What a caller knowing ``password`` answers (RFC 7616 §3.4.1; no qop: RFC 2069's form)."""
    h = HASHES[algorithm]

    def hex_of(text: str) -> str:
        return h(text.encode()).hexdigest()

    ha1 = hex_of(f"{user}:{realm}:{password}")
    ha2 = hex_of(f"{method}:{uri}")
    if qop:
        return hex_of(f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")
    return hex_of(f"{ha1}:{nonce}:{ha2}")


def answer_challenge(challenges: list[str], method: str, uri: str, user: str, password: str) -> str | None:
    """Our ``Authorization`` for the first of ``challenges`` (``WWW-Authenticate`` or
    ``Proxy-Authenticate`` values) whose algorithm we know: the registrar's side of digest, the
    caller's side of ``Admission``. None when none is one we can answer."""
    for header in challenges:
        params = digest_params(header)
        if params is None:
            continue
        algorithm = params.get("algorithm", "MD5").upper()
        algorithm = next((a for a in HASHES if a.upper() == algorithm), "")
        if not algorithm or "nonce" not in params:
            continue
        offered = [q.strip().lower() for q in params.get("qop", "").split(",") if q.strip()]
        if offered and "auth" not in offered:
            continue  # auth-int only: we do not hash bodies
        qop = "auth" if offered else None
        nc, cnonce = ("00000001", secrets.token_hex(8)) if qop else (None, None)
        realm, nonce = params.get("realm", ""), params["nonce"]
        digest = digest_response(algorithm, user, realm, password, method, uri, nonce, nc, cnonce, qop)
        fields = [f'username="{user}"', f'realm="{realm}"', f'nonce="{nonce}"', f'uri="{uri}"', f'response="{digest}"', f"algorithm={algorithm}"]
        if "opaque" in params:
            fields.append(f'opaque="{params["opaque"]}"')
        if qop:
            fields += [f"qop={qop}", f"nc={nc}", f'cnonce="{cnonce}"']
        return "Digest " + ", ".join(fields)
    return None


class Admission:
    def __init__(self, config: SipConfig) -> None:
        self.networks = [ipaddress.ip_network(s, strict=False) for s in config.allowed_sources]
        self.credentials = dict(config.credentials)
        self.algorithms = list(config.digest_algorithms)
        self.realm = config.realm
        self.nonces: OrderedDict[str, Nonce] = OrderedDict()
        self.refused = 0  # requests refused for their source or their credentials (stats)

    @property
    def restricted(self) -> bool:
        """Whether anything limits who may call."""
        return bool(self.networks or self.credentials)

    def source_allowed(self, host: str) -> bool:
        if not self.networks:
            return True
        try:
            address = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return False
        return any(address in network for network in self.networks)

    def refusal(self, msg: SipMessage) -> SipMessage | None:
        """The answer refusing an INVITE that opens a call (401: a challenge, 403: wrong
        credentials); None: admitted."""
        if not self.credentials:
            return None
        offered = [p for p in (digest_params(h) for h in msg.get_all("Authorization")) if p is not None and p.get("realm") == self.realm]
        if not offered:
            return self._challenge(msg, stale=False)
        given = offered[0]
        nonce = self.nonces.get(given.get("nonce", ""))
        if nonce is None or time.monotonic() - nonce.issued > NONCE_LIFETIME_S:
            return self._challenge(msg, stale=True)
        algorithm = given.get("algorithm", "MD5").upper()
        algorithm = next((a for a in self.algorithms if a.upper() == algorithm), "")
        password = self.credentials.get(given.get("username", ""))
        qop = given.get("qop")
        if qop is not None and qop.lower() != "auth":
            return self._forbidden(msg, "only qop=auth is offered")
        count = 0
        if qop:
            try:
                count = int(given.get("nc", ""), 16)
            except ValueError:
                return self._forbidden(msg, "a nonce count is hexadecimal")
            if count <= nonce.last_count:
                return self._challenge(msg, stale=True)  # a replay, or an answer out of order
        if not algorithm:
            return self._forbidden(msg, "algorithm not offered")
        if password is None or not given.get("response"):
            return self._forbidden(msg, "wrong credentials")
        # the digest's uri is what the caller hashed; it need not be our Request-URI byte for
        # byte (a proxy in front may rewrite that), and a replay is stopped by the nonce count
        expected = digest_response(algorithm, given["username"], self.realm, password, msg.method or "", given.get("uri", ""),
                                   given["nonce"], given.get("nc"), given.get("cnonce"), qop)
        if not hmac.compare_digest(expected.encode(), given["response"].lower().encode()):
            return self._forbidden(msg, "wrong credentials")
        if qop:
            nonce.last_count = count
        else:
            del self.nonces[given["nonce"]]  # no nonce count to tell a replay: the nonce serves once
        return None

    def _challenge(self, msg: SipMessage, *, stale: bool) -> SipMessage:
        value = secrets.token_hex(16)
        self.nonces[value] = Nonce(time.monotonic())
        while len(self.nonces) > MAX_NONCES:
            self.nonces.popitem(last=False)
        tail = ", stale=true" if stale else ""
        extra = [("WWW-Authenticate", f'Digest realm="{self.realm}", nonce="{value}", algorithm={a}, qop="auth"{tail}') for a in self.algorithms]
        return response(msg, 401, to_tag=token(), extra=extra)

    def _forbidden(self, msg: SipMessage, why: str) -> SipMessage:
        self.refused += 1
        return response(msg, 403, to_tag=token(), reason=f"Forbidden ({why})")

    def forbidden_source(self, msg: SipMessage) -> SipMessage:
        self.refused += 1
        return response(msg, 403, to_tag=token(), reason="Forbidden (source not allowed)")
