"""The fuzzer beyond the WebSocket: HTTP endpoints, WebRTC SDP offers, and SIP (messages, SDP, RTP,
DTMF). Seeded and reproducible like ``bench/fuzz.py``; each generated input must get an answer
that is a protocol error (never a 5xx, never silence where an answer is due), and after every
batch the server must still do the real thing: mint a key, open and end a WebRTC call, answer
OPTIONS and complete a SIP call; its log free of tracebacks, ``/healthz`` 200.

    python -m bench.fuzz_wire --http 3000 --sip 20000 --seed 1     # spawns a synthetic server

``run_http`` / ``run_sip`` are what the CI test calls (tests/protocol/test_fuzz_wire.py).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import random
import socket
import struct
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from .fuzz import LogWatch, healthz
from .fuzz_gen import Generator, Pairs, Raw, dumps

API_KEY = "fuzz-key"
# a method outside these is refused by the HTTP parser itself (400, plain text), before any route
EARLY_ANSWER_BODY = 256 * 1024
# malformed requests whose body never completes: the client half-closes, so no answer is due
INCOMPLETE = {"short_body", "chunked", "both_lengths", "bad_length"}
STANDARD_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"}


@dataclass
class WireStats:
    sent: int = 0
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    checks: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"sent": self.sent, "answers": dict(self.statuses.most_common()), "checks_passed": self.checks, "failures": len(self.failures)}


def fail(stats: WireStats, what: str, why: str, sample: Any) -> None:
    record = {"input": what, "failure": why, "sample": repr(sample)[:600]}
    stats.failures.append(record)
    print(f"FAILURE: {what}: {why}\n    {record['sample']}", file=sys.stderr)


# ============================================================================ SDP


SIP_OFFER = "v=0\r\no=fuzz 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio {port} RTP/AVP 0 8 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\na=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-16\r\na=ptime:20\r\na=sendrecv\r\n"


def mutate_sdp(rng: random.Random, sdp: str) -> str | bytes:
    lines = sdp.replace("\r\n", "\n").rstrip("\n").split("\n")
    for _ in range(rng.choice([1, 1, 2, 3])):
        op = rng.choice(["delete", "duplicate", "swap", "token", "insert", "insert", "truncate", "many_m", "huge", "order"])
        i = rng.randrange(len(lines)) if lines else 0
        if not lines:
            lines = [""]
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "swap" and len(lines) > 1:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "token":
            tokens = lines[i].split(" ")
            k = rng.randrange(len(tokens))
            tokens[k] = rng.choice(["", "0", "-1", "65536", "99999999999999999999", "x" * 5000, "IN", "IP6", "::1", "256.1.1.1", "RTP/SAVPF", "\x00", "é", "a=", "=", "m=audio"])
            lines[i] = " ".join(tokens)
        elif op == "insert":
            lines.insert(
                i,
                rng.choice(
                    [
                        "m=video 9 UDP/TLS/RTP/SAVPF 96",
                        "m=audio 0 RTP/AVP 0",
                        "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
                        "a=rtpmap:96 opus/48000/2",
                        "a=rtpmap:0",
                        "a=fingerprint:sha-256 ZZ",
                        "a=setup:bogus",
                        "a=ice-ufrag:",
                        "a=candidate:1 1 udp 1 999.1.1.1 70000 typ host",
                        "a=candidate:garbage",
                        "a=ssrc:abc cname:x",
                        "a=mid:" + "m" * 300,
                        "a=group:BUNDLE 0 1 2 3 4 5",
                        "a=sctp-port:-5",
                        "a=max-message-size:0",
                        "a=fmtp:101 0-99999",
                        "c=IN IP4",
                        "c=IN IP4 0.0.0.0",
                        "b=AS:-1",
                        "k=clear:x",
                        "z=",
                        "x" * 100,
                        "=",
                    ]
                ),
            )
        elif op == "truncate":
            text = "\r\n".join(lines)
            return text[: rng.randrange(len(text) + 1)]
        elif op == "many_m":
            for n in range(rng.choice([20, 200])):
                lines += ["m=audio 9 UDP/TLS/RTP/SAVPF 111", "a=rtpmap:111 opus/48000/2", f"a=mid:{n}"]
        elif op == "huge":
            lines.insert(i, "a=x-fuzz:" + "y" * rng.choice([10_000, 60_000]))
        elif op == "order":
            rng.shuffle(lines)
    text = rng.choice(["\r\n", "\n", "\r"]).join(lines) + rng.choice(["\r\n", "", "\n"])
    if rng.random() < 0.05:
        raw = text.encode(errors="surrogatepass")
        at = rng.randrange(len(raw) + 1)
        return raw[:at] + b"\xff\xfe" + raw[at:]
    return text


# ============================================================================ HTTP


@dataclass
class Request:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    raw: bytes | None = None  # sent as is, instead of the above (malformed HTTP)

    def encode(self, host: str) -> bytes:
        if self.raw is not None:
            return self.raw
        head = [f"{self.method} {self.path} HTTP/1.1", f"Host: {host}"]
        if not any(k.lower() in ("content-length", "transfer-encoding") for k, _ in self.headers):
            head.append(f"Content-Length: {len(self.body)}")
        head += [f"{k}: {v}" for k, v in self.headers]
        head.append("Connection: close")
        return "\r\n".join(head).encode(errors="surrogatepass") + b"\r\n\r\n" + self.body


class HttpGenerator:
    ROUTES = [
        ("POST", "/v1/realtime/calls"),
        ("POST", "/v1/realtime?model=fuzz"),
        ("POST", "/v1/realtime/client_secrets"),
        ("POST", "/v1/realtime/sessions"),
        ("POST", "/v1/realtime/calls/{call}/accept"),
        ("POST", "/v1/realtime/calls/{call}/reject"),
        ("POST", "/v1/realtime/calls/{call}/refer"),
        ("POST", "/v1/realtime/calls/{call}/hangup"),
        ("POST", "/v1/realtime/calls/{call}/{junk}"),
        ("DELETE", "/v1/realtime/calls/{call}"),
        ("GET", "/v1/realtime/calls"),
        ("PUT", "/v1/realtime/client_secrets"),
        ("GET", "/healthz"),
        ("GET", "/metrics"),
    ]

    def __init__(self, seed: int, offer: str) -> None:
        self.rng = random.Random(seed)
        self.offer = offer
        self.events = Generator(seed)  # for mutated JSON values

    def _auth(self) -> list[tuple[str, str]]:
        r = self.rng
        x = r.random()
        if x < 0.7:
            return [("Authorization", f"Bearer {API_KEY}")]
        return [("Authorization", r.choice(["Bearer wrong", "Bearer ek_" + "0" * 48, "Basic abc", "Bearer", "Bearer " + "k" * 5000, "Bearer \u00e9"]))] if x < 0.95 else []

    def _json(self, route: str) -> Any:
        r = self.rng
        if "client_secrets" in route:
            base: Any = {"expires_after": {"anchor": "created_at", "seconds": r.choice([10, 600, 7200])}, "session": self.events.ga_session()}
        elif "sessions" in route:
            base = self.events.beta_session()
        elif route.endswith("accept"):
            base = self.events.ga_session()
        elif route.endswith("reject"):
            base = {"status_code": r.choice([486, 603])}
        elif route.endswith("refer"):
            base = {"target_uri": "tel:+14155550100"}
        else:
            base = {}
        if r.random() < 0.7:
            paths = self.events._paths(base)
            path = r.choice(paths)
            if path:
                parent = base
                for key in path[:-1]:
                    parent = parent[key]
                if r.random() < 0.3 and isinstance(parent, dict):
                    del parent[path[-1]]
                else:
                    parent[path[-1]] = self.events._value()
            else:
                base = self.events._value()
        return base

    def _multipart(self) -> tuple[str, bytes]:
        r = self.rng
        boundary = r.choice(["fuzzb", "x" * 70, "", "a b", "--"])
        parts = []
        for name in r.sample(["sdp", "session", "sdp", "other"], r.randint(0, 3)):
            value: bytes
            if name == "sdp":
                sdp = mutate_sdp(r, self.offer) if r.random() < 0.5 else self.offer
                value = sdp if isinstance(sdp, bytes) else sdp.encode()
            elif name == "session":
                value = dumps(self._json("/accept")).encode(errors="surrogatepass")
            else:
                value = r.randbytes(r.choice([0, 10, 1000]))
            disposition = f'form-data; name="{name}"' + (f'; filename="{name}.txt"' if r.random() < 0.3 else "")
            parts.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n")
        body = b"".join(parts) + (f"--{boundary}--\r\n".encode() if r.random() < 0.8 else b"")
        if r.random() < 0.2:
            cut = r.randrange(len(body) + 1)
            body = body[:cut]
        return f"multipart/form-data; boundary={boundary}" if r.random() < 0.9 else "multipart/form-data", body

    def next(self) -> Request:
        r = self.rng
        if r.random() < 0.12:
            return self._malformed()
        method, route = r.choice(self.ROUTES)
        if r.random() < 0.05:
            method = r.choice(["GET", "PUT", "PATCH", "OPTIONS", "HEAD", "FOO"])
        path = route.replace("{call}", r.choice(["rtc_0000", "x", "%00", "a" * 300, "..%2F..", "sip_" + "1" * 20])).replace("{junk}", r.choice(["", "x", "accept/more"]))
        headers = self._auth()
        ctype, body = None, b""
        x = r.random()
        if route in ("/v1/realtime/calls", "/v1/realtime?model=fuzz"):
            if x < 0.45:
                ctype = "application/sdp"
                sdp = mutate_sdp(r, self.offer) if r.random() < 0.85 else self.offer
                body = sdp if isinstance(sdp, bytes) else sdp.encode()
            elif x < 0.75:
                ctype, body = self._multipart()
            else:
                ctype, body = r.choice(["application/json", "text/plain", ""]), r.choice([b"", b"{}", b"v=0", r.randbytes(100)])
        else:
            if x < 0.75:
                ctype = r.choice(["application/json", "application/json; charset=utf-8", "application/sdp", "text/plain", "", "multipart/form-data"])
                body = dumps(self._json(route)).encode(errors="surrogatepass")
                if r.random() < 0.15:
                    body = body[: r.randrange(len(body) + 1)]
            elif x < 0.9:
                ctype, body = "application/json", r.choice([b"", b"null", b"[]", b"\xff\xfe{}", b"[" * 100_000, b'{"a":' * 5000, b"1e999", r.randbytes(64)])
            else:
                ctype, body = "application/json", b'{"x":"' + b"y" * r.choice([1 << 20, (1 << 20) + 10, 3 << 20]) + b'"}'
        if ctype is not None and r.random() < 0.95:
            headers.append(("Content-Type", ctype))
        if r.random() < 0.05:
            headers.append(("Content-Type", "application/json"))  # a second one
        if r.random() < 0.05:
            headers.append(("OpenAI-Beta", "realtime=v1"))
        return Request(method, path, headers, body)

    def _malformed(self) -> Request:
        r = self.rng
        kind = r.choice(["huge_header", "many_headers", "bad_line", "bad_version", "short_body", "chunked", "both_lengths", "bad_length", "nul", "long_target"])
        base = f"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer {API_KEY}\r\n"
        raw = {
            "huge_header": base + "X-Big: " + "a" * r.choice([40_000, 200_000, 1 << 20]) + "\r\nContent-Length: 2\r\n\r\n{}",
            "many_headers": base + "".join(f"X-H{i}: v\r\n" for i in range(r.choice([101, 1000, 5000]))) + "Content-Length: 2\r\n\r\n{}",
            "bad_line": r.choice(["GARBAGE\r\n\r\n", "GET\r\n\r\n", " / HTTP/1.1\r\n\r\n", "GET /\x00 HTTP/1.1\r\n\r\n", "\r\n\r\n\r\n"]),
            "bad_version": "GET /healthz HTTP/9.9\r\nHost: h\r\n\r\n",
            "short_body": base + "Content-Length: 100\r\n\r\n{}",
            "chunked": base + "Transfer-Encoding: chunked\r\n\r\n" + r.choice(["zz\r\n{}\r\n0\r\n\r\n", "2\r\n{}\r\n", "FFFFFFFFFFFF\r\n{}", "2\r\n{}\r\n0\r\n\r\n"]),
            "both_lengths": base + "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
            "bad_length": base + "Content-Length: " + r.choice(["-1", "abc", "1e3", "99999999999999999999", "2, 3"]) + "\r\n\r\n{}",
            "nul": base.replace("Host: h", "Host: h\x00x") + "Content-Length: 2\r\n\r\n{}",
            "long_target": "GET /" + "a" * r.choice([40_000, 100_000]) + " HTTP/1.1\r\nHost: h\r\n\r\n",
        }[kind]
        return Request("RAW", kind, [], b"", raw=raw.encode(errors="surrogatepass"))


async def http_exchange(host: str, port: int, req: Request, timeout: float = 15.0) -> tuple[int | None, bytes, dict[str, str]]:
    """Send one request on its own connection; (status or None when closed with no answer, body, headers)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        with contextlib.suppress(ConnectionError):
            writer.write(req.encode(f"{host}:{port}"))
            await writer.drain()
            if req.raw is not None and req.path in INCOMPLETE:
                writer.write_eof()  # the body it promised never comes: the server sees the end
        async with asyncio.timeout(timeout):
            data = await reader.read(-1) if req.raw is not None else await _read_response(reader, req.method == "HEAD")
    except (ConnectionError, asyncio.IncompleteReadError):
        data = b""
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    if not data.startswith(b"HTTP/1."):
        return None, data, {}
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split(" ")[1]), body, headers


async def _read_response(reader: asyncio.StreamReader, head_only: bool) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    if head_only:
        return head
    length = None
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    body = await reader.readexactly(length) if length is not None else await reader.read(-1)
    return head + body


def _is_error_shape(body: bytes) -> bool:
    try:
        err = json.loads(body)["error"]
        return isinstance(err["type"], str) and isinstance(err["message"], str) and "code" in err and "param" in err
    except (ValueError, KeyError, TypeError):
        return False


def _server_state(why: str | None, logs: LogWatch, url: str) -> str | None:
    """A batch's failure: its own check's, else a new problem in the server log, else /healthz."""
    if why is None and (problems := logs.new_problems()):
        why = f"server log: {problems[0][:300]}"
    if why is None and healthz(url) != 200:
        why = "/healthz is not 200"
    return why

async def _http_check(host: str, port: int, offer: str) -> str | None:
    """The real thing still works: a key is minted, a WebRTC call opened and hung up."""
    auth = [("Authorization", f"Bearer {API_KEY}")]
    status, body, _ = await http_exchange(host, port, Request("POST", "/v1/realtime/client_secrets", auth + [("Content-Type", "application/json")], b"{}"))
    if status != 200 or not json.loads(body).get("value", "").startswith("ek_"):
        return f"minting a key: {status} {body[:200]!r}"
    status, body, headers = await http_exchange(host, port, Request("POST", "/v1/realtime/calls", auth + [("Content-Type", "application/sdp")], offer.encode()))
    if status != 201 or not body.startswith(b"v=0"):
        return f"a WebRTC offer: {status} {body[:200]!r}"
    status, body, _ = await http_exchange(host, port, Request("DELETE", headers["location"], auth, b""))
    if status != 200:
        return f"hanging up the call: {status} {body[:200]!r}"
    return None


async def run_http(url: str, *, requests: int, seed: int = 1, logs: LogWatch | None = None, batch: int = 100, concurrency: int = 8, offer: str | None = None) -> WireStats:
    host, port = url.split("//")[1].split("/")[0].split(":")
    port_n = int(port)
    logs = logs or LogWatch()
    if offer is None:
        from .rtc import offer_sdp  # aiortc: only when a run needs it

        offer = await offer_sdp()
    gen = HttpGenerator(seed, offer)
    stats = WireStats()
    sem = asyncio.Semaphore(concurrency)

    async def one(req: Request) -> None:
        async with sem:
            try:
                status, body, headers = await http_exchange(host, port_n, req)
            except TimeoutError:
                fail(stats, f"{req.method} {req.path}", "no answer within 15 s", req.body[:300] or req.raw)
                return
        stats.sent += 1
        stats.statuses[str(status)] += 1
        what = f"{req.method} {req.path} ({dict(req.headers).get('Content-Type')})"
        if status is None:
            if req.raw is None and len(req.body) > EARLY_ANSWER_BODY:
                # answered (404, 413) before the body was read: closing with it unread makes the
                # kernel reset the connection, which can destroy the answer in flight
                stats.statuses["reset after an early answer"] += 1
            elif req.raw is None:
                fail(stats, what, "connection closed with no answer", req.body[:300])
            return  # malformed HTTP: closing may be the answer (h11 answers most with 400)
        if status >= 500 and status != 503:
            fail(stats, what, f"status {status}: {body[:300]!r}", req.body[:300] or req.raw)
        elif status >= 400 and req.raw is None and req.method in STANDARD_METHODS and req.path.startswith("/v1/") and status not in (404, 405) and not _is_error_shape(body):
            fail(stats, what, f"status {status} without an OpenAI-shaped error: {body[:200]!r}", req.body[:300])
        elif status == 201 and "location" in headers:  # an offer that was good enough: end the call
            await http_exchange(host, port_n, Request("DELETE", headers["location"], [("Authorization", f"Bearer {API_KEY}")], b""))

    done = 0
    while done < requests:
        reqs = [gen.next() for _ in range(min(batch, requests - done))]
        done += len(reqs)
        await asyncio.gather(*(one(r) for r in reqs))
        why = _server_state(await _http_check(host, port_n, offer), logs, url)
        if why is not None:
            fail(stats, f"batch ending at {done}", why, [r.method + " " + r.path for r in reqs][-10:])
            break
        stats.checks += 1
    return stats


# ============================================================================ SIP


class SipGenerator:
    METHODS = ["INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "REGISTER", "NOTIFY", "REFER", "INFO", "MESSAGE", "UPDATE", "PRACK", "SUBSCRIBE", "FOO"]

    def __init__(self, seed: int, sip_port: int, local_port: int, rtp_port: int) -> None:
        self.rng = random.Random(seed)
        self.sip_port, self.local_port, self.rtp_port = sip_port, local_port, rtp_port
        self.n = 0

    def message(self, method: str, call_id: str, cseq: int = 1, body: str | bytes = "", to_tag: str = "", branch: str | None = None) -> list[tuple[str, str]] | Any:
        headers = [
            ("Via", f"SIP/2.0/UDP 127.0.0.1:{self.local_port};branch={branch or 'z9hG4bK' + call_id + method + str(cseq)};rport"),
            ("Max-Forwards", "70"),
            ("From", f"<sip:fuzz@127.0.0.1>;tag=f{call_id}"),
            ("To", "<sip:agent@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")),
            ("Call-ID", call_id),
            ("CSeq", f"{cseq} {method}"),
            ("Contact", f"<sip:fuzz@127.0.0.1:{self.local_port}>"),
        ]
        if body:
            headers.append(("Content-Type", "application/sdp"))
        return headers

    def encode(self, start: str, headers: list[tuple[str, str]], body: str | bytes, length: int | None = None) -> bytes:
        raw_body = body if isinstance(body, bytes) else body.encode(errors="surrogatepass")
        lines = [start, *(f"{k}: {v}" for k, v in headers), f"Content-Length: {len(raw_body) if length is None else length}"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode(errors="surrogatepass") + raw_body

    def next(self) -> tuple[str, bytes]:
        """("sip", datagram) for the SIP port, or ("rtp", packet) for the check call's RTP port."""
        r = self.rng
        self.n += 1
        if r.random() < 0.3:
            return "rtp", self.rtp()
        method = r.choice(self.METHODS)
        call_id = f"fz{self.n}" if r.random() < 0.6 else r.choice(["fzcall", "", "x" * 500])
        body: str | bytes = ""
        if method in ("INVITE", "UPDATE") or r.random() < 0.05:
            body = SIP_OFFER.format(port=self.rtp_port + 2)
            if r.random() < 0.7:
                body = mutate_sdp(r, body)
        headers = self.message(method, call_id, r.choice([1, 2, 0, 2**31, 2**32]), body, to_tag=r.choice(["", "", "t1"]))
        start = f"{method} sip:agent@127.0.0.1:{self.sip_port} SIP/2.0"
        length: int | None = None
        x = r.random()
        if x < 0.15 and headers:  # drop a header
            del headers[r.randrange(len(headers))]
        elif x < 0.3:  # a header's value
            i = r.randrange(len(headers))
            headers[i] = (headers[i][0], r.choice(["", " ", "x" * 3000, "<>", ";;;", "\x00", "é", "SIP/2.0/TCP a:b", "1 INVITE x", "-1", "99999999999 INVITE", "sip:a@b;branch=", "<sip:a@[::1]:99999>"]))
        elif x < 0.4:  # duplicate headers
            headers += [headers[r.randrange(len(headers))]] * r.choice([1, 2, 50])
        elif x < 0.47:
            start = r.choice(["INVITE", "SIP/2.0 200 OK", "SIP/2.0 999 Odd", "SIP/3.0 200 OK", f"{method} sip:x SIP/3.0", f"{method}  SIP/2.0", "", f"{method} <sip:a> SIP/2.0", "HTTP/1.1 200 OK"])
        elif x < 0.52:
            length = r.choice([0, 10_000, -1, len(body) // 2 if body else 1])
        elif x < 0.56:
            headers.append((r.choice(["Require", "Proxy-Require", "Supported"]), r.choice(["100rel", "foo", "timer, bar"])))
        elif x < 0.6:
            headers = [(k.lower() if r.random() < 0.5 else k.upper(), v) for k, v in headers]  # names in any case; compact forms
            headers.append(("i" if r.random() < 0.5 else "v", "compact"))
        elif x < 0.63:
            headers.insert(0, ("Max-Forwards", "0"))
        data = self.encode(start, headers, body, length)
        y = r.random()
        if y < 0.1:
            data = data[: r.randrange(len(data) + 1)]
        elif y < 0.15:
            at = r.randrange(len(data) + 1)
            data = data[:at] + r.choice([b"\xff", b"\x00", b"\r\n", b"\r\n\r\n", b":"]) + data[at:]
        elif y < 0.18:
            data = r.randbytes(r.choice([0, 1, 12, 100, 1400]))
        elif y < 0.2:
            data = data.replace(b"\r\n", b"\n")
        return "sip", data

    def rtp(self) -> bytes:
        r = self.rng
        pt = r.choice([0, 0, 0, 8, 101, 101, 13, 96, 127])
        v = r.choice([2, 2, 2, 0, 1, 3])
        marker = r.random() < 0.1
        padding = r.random() < 0.05
        ext = r.random() < 0.05
        cc = r.choice([0, 0, 0, 3, 15])
        seq = r.choice([self.n & 0xFFFF, r.randrange(65536), 0, 65535])
        ts = r.randrange(2**32)
        head = struct.pack("!BBHII", (v << 6) | (padding << 5) | (ext << 4) | cc, (marker << 7) | pt, seq, ts, 0xF00D) + b"\x00" * 4 * (cc if r.random() < 0.8 else 0)
        if ext:
            head += struct.pack("!HH", 0xBEDE, r.choice([0, 1, 1000])) + b"\x00" * 4 * r.choice([0, 1])
        if pt == 101:
            event = r.choice([0, 5, 11, 16, 255])
            payload = struct.pack("!BBH", event, (r.random() < 0.3) << 7 | r.randrange(64), r.choice([0, 160, 65535]))[: r.choice([4, 4, 4, 2, 0])]
        else:
            payload = r.randbytes(r.choice([160, 160, 0, 1, 159, 161, 1400, 8000]))
        data = head + payload
        if padding:
            data += bytes([r.choice([0, 1, 4, 255])])
        if r.random() < 0.05:
            data = data[: r.randrange(13)]
        return data


class SipPeer:
    """A UDP socket that sends datagrams and collects what comes back (SIP answers, RTP)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def drain(self) -> list[bytes]:
        out = []
        while True:
            try:
                out.append(self.sock.recv(65535))
            except BlockingIOError:
                return out

    async def answer(self, predicate: Any, timeout: float) -> bytes | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            for data in self.drain():
                if predicate(data):
                    return data
            await asyncio.sleep(0.005)
        return None


async def _sip_call(gen: SipGenerator, peer: SipPeer, rtp: SipPeer, server: tuple[str, int], n: int) -> str | None:
    """OPTIONS gets 200; a call is answered (200 with SDP), ACKed, gets RTP, and ends with BYE/200."""
    call_id = f"check{n}"
    peer.drain()
    peer.sock.sendto(gen.encode(f"OPTIONS sip:agent@127.0.0.1:{server[1]} SIP/2.0", gen.message("OPTIONS", call_id + "o"), ""), server)
    if await peer.answer(lambda d: d.startswith(b"SIP/2.0 200") and (call_id + "o").encode() in d, 10) is None:
        return "OPTIONS got no 200 within 10 s"
    sdp = SIP_OFFER.format(port=rtp.port)
    peer.sock.sendto(gen.encode(f"INVITE sip:agent@127.0.0.1:{server[1]} SIP/2.0", gen.message("INVITE", call_id, 1, sdp), sdp), server)
    ok = await peer.answer(lambda d: call_id.encode() in d and d.startswith(b"SIP/2.0 ") and not d.startswith(b"SIP/2.0 1"), 10)
    if ok is None or not ok.startswith(b"SIP/2.0 200"):
        return f"INVITE: {ok[:80] if ok else 'no final answer within 10 s'}"
    to = next(line for line in ok.decode().split("\r\n") if line.lower().startswith("to:"))
    tag = to.split("tag=")[1].split(";")[0]
    peer.sock.sendto(gen.encode(f"ACK sip:agent@127.0.0.1:{server[1]} SIP/2.0", gen.message("ACK", call_id, 1, to_tag=tag, branch="z9hG4bKack" + call_id), ""), server)
    rtp.drain()
    if await rtp.answer(lambda d: len(d) >= 12, 3) is None:
        return "no RTP from the answered call within 3 s"
    peer.sock.sendto(gen.encode(f"BYE sip:agent@127.0.0.1:{server[1]} SIP/2.0", gen.message("BYE", call_id, 2, to_tag=tag), ""), server)
    if await peer.answer(lambda d: d.startswith(b"SIP/2.0 200") and call_id.encode() in d and b"BYE" in d, 3) is None:
        return "BYE got no 200 within 3 s"
    return None


async def run_sip(url: str, sip_port: int, *, datagrams: int, seed: int = 1, logs: LogWatch | None = None, batch: int = 200) -> WireStats:
    """Fuzzed SIP datagrams to the bridge, and fuzzed RTP (with DTMF) to a live call's RTP port."""
    logs = logs or LogWatch()
    server = ("127.0.0.1", sip_port)
    peer, rtp_in = SipPeer(), SipPeer()
    gen = SipGenerator(seed, sip_port, peer.port, rtp_in.port)
    stats = WireStats()
    # a live call whose RTP port the fuzzed RTP goes to
    live_id = "fzlive"
    sdp = SIP_OFFER.format(port=rtp_in.port)
    peer.sock.sendto(gen.encode(f"INVITE sip:agent@127.0.0.1:{sip_port} SIP/2.0", gen.message("INVITE", live_id, 1, sdp), sdp), server)
    ok = await peer.answer(lambda d: d.startswith(b"SIP/2.0 200") and live_id.encode() in d, 10)
    if ok is None:
        fail(stats, "setup", "the live call was not answered", "")
        return stats
    text = ok.decode()
    media_port = int(text.split("m=audio ")[1].split()[0])
    tag = next(line for line in text.split("\r\n") if line.lower().startswith("to:")).split("tag=")[1].split(";")[0]
    peer.sock.sendto(gen.encode(f"ACK sip:agent@127.0.0.1:{sip_port} SIP/2.0", gen.message("ACK", live_id, 1, to_tag=tag, branch="z9hG4bKacklive"), ""), server)
    sent = 0
    while sent < datagrams:
        for _ in range(min(batch, datagrams - sent)):
            where, data = gen.next()
            target = server if where == "sip" else ("127.0.0.1", media_port)
            with contextlib.suppress(OSError):
                peer.sock.sendto(data, target)
            stats.statuses[where] += 1
            sent += 1
            if sent % 20 == 0:
                await asyncio.sleep(0.001)  # UDP: let the server read, as a real trunk would pace
        stats.sent = sent
        await asyncio.sleep(0.05)
        answers = peer.drain()
        for a in answers:
            stats.statuses["answer " + a[:12].decode(errors="replace")] += 1
        why = _server_state(await _sip_call(gen, SipPeer(), SipPeer(), server, stats.checks), logs, url)
        if why is not None:
            fail(stats, f"SIP batch ending at {sent}", why, "")
            break
        stats.checks += 1
    return stats


def server_config(sip_port: int) -> dict[str, Any]:
    from .fuzz import synthetic_server_config

    cfg = synthetic_server_config()
    cfg["api_key"] = API_KEY
    cfg["limits"]["max_sessions"] = 1000
    cfg["limits"]["header_timeout_s"] = 2.0
    cfg["sip"] = {"port": sip_port, "rtp_timeout_s": 3.0, "ring_timeout_s": 3.0, "t1_ms": 100}
    cfg["webrtc"] = {"connect_timeout_s": 3.0, "media_timeout_s": 3.0, "host_addresses": ["127.0.0.1"]}
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--http", type=int, default=2000, help="HTTP requests (endpoints, WebRTC offers)")
    parser.add_argument("--sip", type=int, default=20000, help="SIP and RTP datagrams")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    from bench.common import machine, save, server_process

    sip_port = _free_udp_port()
    result: dict[str, Any] = {"command": "python -m bench.fuzz_wire " + " ".join(argv if argv is not None else sys.argv[1:]), "seed": args.seed}
    with server_process(server_config(sip_port), startup_s=120) as url:
        logs = LogWatch(url.log)
        t0 = time.monotonic()
        http = asyncio.run(run_http(url, requests=args.http, seed=args.seed, logs=logs)) if args.http else WireStats()
        result["http"] = {**http.summary(), "seconds": round(time.monotonic() - t0, 1), "failure_records": http.failures}
        t0 = time.monotonic()
        sip = asyncio.run(run_sip(url, sip_port, datagrams=args.sip, seed=args.seed, logs=logs)) if args.sip else WireStats()
        result["sip"] = {**sip.summary(), "seconds": round(time.monotonic() - t0, 1), "failure_records": sip.failures}
        result["healthz"] = healthz(url)
    result["machine"] = machine()
    path = save("fuzz_wire", result)
    print(json.dumps(result, indent=1))
    print(f"saved {path}")
    return 1 if http.failures or sip.failures else 0


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


__all__ = ["Pairs", "Raw", "run_http", "run_sip"]

if __name__ == "__main__":
    sys.exit(main())
