"""SIP messages (RFC 3261 section 7): parsing what arrives in one UDP datagram, and building
requests and responses. Nothing here knows about calls or transactions."""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field

Addr = tuple[str, int]  # a UDP peer: where a message came from or goes to

MAX_MESSAGE = 65535
# RFC 3261 7.3.3 compact forms
COMPACT = {"v": "via", "f": "from", "t": "to", "i": "call-id", "m": "contact", "l": "content-length", "c": "content-type", "k": "supported", "s": "subject", "r": "refer-to", "b": "referred-by"}
CANONICAL = {
    "via": "Via",
    "from": "From",
    "to": "To",
    "call-id": "Call-ID",
    "cseq": "CSeq",
    "contact": "Contact",
    "content-length": "Content-Length",
    "content-type": "Content-Type",
    "max-forwards": "Max-Forwards",
    "record-route": "Record-Route",
    "www-authenticate": "WWW-Authenticate",
}
# Every status of RFC 3261 section 21, 202 (RFC 3515: REFER) and 494 (RFC 3329): an answer
# carries its phrase, never "Unknown" (a 401 challenge read "401 Unknown" before 2026-11-29)
REASONS = {
    100: "Trying",
    180: "Ringing",
    181: "Call Is Being Forwarded",
    182: "Queued",
    183: "Session Progress",
    200: "OK",
    202: "Accepted",
    300: "Multiple Choices",
    301: "Moved Permanently",
    302: "Moved Temporarily",
    305: "Use Proxy",
    380: "Alternative Service",
    400: "Bad Request",
    401: "Unauthorized",
    402: "Payment Required",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    410: "Gone",
    413: "Request Entity Too Large",
    414: "Request-URI Too Long",
    415: "Unsupported Media Type",
    416: "Unsupported URI Scheme",
    420: "Bad Extension",
    421: "Extension Required",
    423: "Interval Too Brief",
    480: "Temporarily Unavailable",
    481: "Call/Transaction Does Not Exist",
    482: "Loop Detected",
    483: "Too Many Hops",
    484: "Address Incomplete",
    485: "Ambiguous",
    486: "Busy Here",
    487: "Request Terminated",
    488: "Not Acceptable Here",
    491: "Request Pending",
    493: "Undecipherable",
    494: "Security Agreement Required",
    500: "Server Internal Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Server Time-out",
    505: "Version Not Supported",
    513: "Message Too Large",
    600: "Busy Everywhere",
    603: "Decline",
    604: "Does Not Exist Anywhere",
    606: "Not Acceptable",
}


class SipParseError(ValueError):
    pass


@dataclass
class SipMessage:
    method: str | None = None  # a request's method, None for a response
    uri: str = ""
    status: int = 0
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)  # (canonical name, value) in order
    body: bytes = b""

    @property
    def is_request(self) -> bool:
        return self.method is not None

    def get(self, name: str) -> str | None:
        key = name.lower()
        for k, v in self.headers:
            if k.lower() == key:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        key = name.lower()
        return [v for k, v in self.headers if k.lower() == key]

    @property
    def call_id(self) -> str:
        return self.get("Call-ID") or ""

    @property
    def cseq(self) -> tuple[int, str]:
        number, _, method = (self.get("CSeq") or "").strip().partition(" ")
        return int(number), method.strip().upper()

    @property
    def branch(self) -> str | None:
        via = self.get("Via")
        return param(via, "branch") if via else None

    def encode(self) -> bytes:
        start = f"{self.method} {self.uri} SIP/2.0" if self.method else f"SIP/2.0 {self.status} {self.reason}"
        lines = [start] + [f"{k}: {v}" for k, v in self.headers if k.lower() != "content-length"]
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


def param(header: str, name: str) -> str | None:
    """A ``;name=value`` parameter of a header value (after any <uri>)."""
    tail = header.rsplit(">", 1)[-1] if ">" in header else header
    for part in tail.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.strip().lower() == name:
            return value.strip().strip('"')
    return None


def uri_of(header: str) -> str:
    """The URI in a From/To/Contact value: inside <...> if present, else up to parameters."""
    if "<" in header and ">" in header:
        return header[header.index("<") + 1 : header.index(">")]
    return header.split(";")[0].strip()


def parse(data: bytes) -> SipMessage:
    if len(data) > MAX_MESSAGE:
        raise SipParseError("message too large")
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        head, sep, body = data.partition(b"\n\n")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise SipParseError("headers are not UTF-8") from None
    lines = text.replace("\r\n", "\n").split("\n")
    start = lines[0].strip()
    msg = SipMessage()
    if start.startswith("SIP/"):
        parts = start.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit() or len(parts[1]) != 3:
            raise SipParseError(f"bad status line {start!r}")
        msg.status, msg.reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
    else:
        parts = start.split(" ")
        if len(parts) != 3 or not parts[0].isalpha() or not parts[0].isupper():
            raise SipParseError(f"bad request line {start!r}")
        if parts[2] != "SIP/2.0":
            raise SipVersionError(parts[2])
        msg.method, msg.uri = parts[0], parts[1]
    for line in lines[1:]:
        if not line.strip():
            continue
        if line[0] in " \t" and msg.headers:  # folded continuation (RFC 3261 7.3.1)
            name, value = msg.headers[-1]
            msg.headers[-1] = (name, value + " " + line.strip())
            continue
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise SipParseError(f"bad header line {line[:60]!r}")
        key = name.strip().lower()
        key = COMPACT.get(key, key)
        canonical = CANONICAL.get(key, "-".join(w.capitalize() for w in key.split("-")))
        if key == "via":  # several Vias may share one line
            msg.headers.extend((canonical, v.strip()) for v in _split_commas(value))
        else:
            msg.headers.append((canonical, value.strip()))
    length = msg.get("Content-Length")
    if length is not None:
        if not length.isdigit():
            raise SipParseError("bad Content-Length")
        if int(length) > len(body):
            raise SipParseError("body shorter than Content-Length")
        body = body[: int(length)]
    msg.body = body
    if msg.is_request:
        for required in ("Via", "From", "To", "Call-ID", "CSeq"):
            if msg.get(required) is None:
                raise SipParseError(f"missing {required} header")
        try:
            number, method = msg.cseq
        except ValueError:
            raise SipParseError("bad CSeq") from None
        if method != msg.method or not 0 <= number < 2**31:
            raise SipParseError("CSeq does not match the request")
    return msg


class SipVersionError(SipParseError):
    pass


def _split_commas(value: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in value:
        if ch == "<" or ch == '"':
            depth += 1 if ch == "<" else 0
        if ch == ">":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [v for v in out if v.strip()]


def token(n: int = 10) -> str:
    return "".join(random.choices(string.ascii_lowercase + string.digits, k=n))


def response(request: SipMessage, status: int, *, to_tag: str | None = None, extra: list[tuple[str, str]] | None = None, body: bytes = b"", reason: str | None = None) -> SipMessage:
    """A response to ``request`` (RFC 3261 8.2.6): its Vias, From, Call-ID, CSeq copied, and our
    tag added to To when the response is for a dialog we are in or creating."""
    headers = [(k, v) for k, v in request.headers if k in ("Via", "From", "Call-ID", "CSeq", "Record-Route")]
    to = request.get("To") or ""
    if to_tag and status > 100 and param(to, "tag") is None:
        to = f"{to};tag={to_tag}"
    headers.insert(headers.index(next(h for h in headers if h[0] == "From")) + 1, ("To", to))
    headers.append(("Server", "realtime-omni"))
    headers.extend(extra or [])
    return SipMessage(status=status, reason=reason or REASONS.get(status, "Unknown"), headers=headers, body=body)
