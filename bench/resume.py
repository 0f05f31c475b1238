"""Sessions resumed after dropped connections: seeded drops at random points, checked against a model.

A client on a raw socket (``ResumingClient``: ``bench/rawws.py`` underneath, so it can abort TCP
with nothing said) holds manual turns with the synthetic pipeline set to echo: each turn appends
random audio in random sizes, commits, asks for a response and reads it to ``response.done``. A
seeded generator drops the connection (TCP aborted, no close frame) at random points:

* ``append``: after a random number of a turn's appends, the last 0-3 of them lost in flight (sent,
  never delivered: a resume must bring them);
* ``response``: after a random number of the response's events (the rest are in flight or not made yet);
* ``between``: after ``response.done``, before the next turn;
* ``resume``: right after a resume's upgrade, having read none or some of the replay;

and resumes after a random pause (0-50 ms, so that the server has sometimes noticed the drop and
sometimes still holds the old connection open). A resume sends ``x-session-id``, ``x-resume-token``
and ``last-event-id``, and re-sends every message after the count the server says it took
(``x-client-events-received``). The reference model says what the client must end up with:

* every server event once: the ids, a counter per session, run 1, 2, 3 ... with no gap and no
  repeat, and one ``session.created``;
* per turn, the events an undisturbed manual turn gives, in order (``TURN_EVENTS``, the audio
  deltas as many as the echo's chunks), one ``response.done`` with status ``completed``;
* its answer's audio is the turn's appended audio, byte for byte (the echo): 0 bytes lost either way.

Timing of each resume: the server's own (its ``server-timing`` header: from the upgrade request to
the replay handed to the connection), the upgrade's round trip, and from the upgrade to the first
replayed event. Medians and p90 are printed and saved (bench/results/).

    python -m bench resume --drops 200 --seed 1      # spawns a synthetic server

``run()`` is the library entry the test uses (tests/bench/test_resume.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import statistics
import struct
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from .common import machine, save, server_process
from .rawws import OP_CLOSE, OP_TEXT, RawWebSocket

RATE = 24000
CHUNK_MS = 40  # the synthetic pipeline's audio chunk: an answer of n samples is ceil(n / 960) deltas
CHUNK = RATE * CHUNK_MS // 1000
DROP_POINTS = ("append", "response", "between", "resume")

# What a manual turn gives, in order: the commit, the user's item, the response and its one message.
TURN_HEAD = (
    "input_audio_buffer.committed",
    "conversation.item.added",
    "conversation.item.done",
    "response.created",
    "rate_limits.updated",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
)
TURN_TAIL = (
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
)


def server_config(*, grace_s: float = 30.0, chunk_interval_ms: float = 2.0) -> dict[str, Any]:
    """The synthetic pipeline echoing the user's audio at the wire's rate (so the answer is the
    appended audio, sample for sample), a short text, manual turns, no transcription."""
    return {
        "pipeline": {
            "kind": "synthetic",
            "options": {
                "audio": "echo",
                "reply": "ok",
                "input_rate": RATE,
                "output_rate": RATE,
                "chunk_ms": CHUNK_MS,
                "chunk_interval_ms": chunk_interval_ms,
            },
        },
        "model": "realtime-omni-bench",
        "resume": {"grace_s": grace_s},
        "session": {"audio": {"input": {"turn_detection": None, "transcription": None}}},
    }


def expected_turn(samples: int) -> list[str]:
    """The event types of one undisturbed manual turn whose answer echoes ``samples`` samples."""
    deltas = -(-samples // CHUNK)
    return [*TURN_HEAD, "response.output_audio_transcript.delta", *["response.output_audio.delta"] * deltas, *TURN_TAIL]


def event_number(event_id: str) -> int:
    """The session's counter in a server event id (``event_<stem><counter, 6 hex digits>``)."""
    return int(event_id[-6:], 16)


@dataclass
class Resumed:
    server_ms: float  # the server's own time for the resume (its server-timing header)
    upgrade_ms: float  # the upgrade request sent -> its 101 read
    replayed: int  # events the server said it replays
    taken: int  # client messages the server said it had taken (the client re-sends the rest)
    first_event_ms: float | None = None  # the 101 read -> the first replayed event read


class Refused(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"resume refused: {status} {body[:300]}")
        self.status = status
        self.body = body


def response_headers(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if ":" in line)}


class ResumingClient:
    """A Realtime client that resumes its session after a drop, on a raw socket. ``events`` is
    every server event received, over all its connections, in order; ``sent`` every message it
    sent (a resume re-sends those the server did not take)."""

    def __init__(self, host: str, port: int, *, api_key: str = "bench", model: str = "m") -> None:
        self.host, self.port = host, port
        self.path = f"/v1/realtime?model={urllib.parse.quote(model)}"
        self.auth = {"Authorization": f"Bearer {api_key}"}
        self.ws: RawWebSocket | None = None
        self.session_id = ""
        self.token = ""
        self.events: list[dict[str, Any]] = []
        self.sent: list[bytes] = []
        self.resumes: list[Resumed] = []
        self._replay_due = 0

    @property
    def last_event_id(self) -> str:
        return self.events[-1]["event_id"] if self.events else ""

    async def open(self) -> None:
        ws = await RawWebSocket.connect(self.host, self.port, self.path, self.auth)
        if ws.status != 101:
            raise RuntimeError(f"upgrade refused: {ws.head.decode(errors='replace')}")
        headers = response_headers(ws.head)
        self.ws, self.session_id, self.token = ws, headers["x-session-id"], headers["x-resume-token"]

    def drop(self) -> None:
        """The network goes: TCP aborted, no close frame (what is in flight is lost)."""
        assert self.ws is not None
        self.ws.abort()
        self.ws = None

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.send_frame(OP_CLOSE, struct.pack("!H", 1000))
            await self.ws.close()
            self.ws = None

    async def resume(self, *, token: str | None = None, last_event_id: str | None = None) -> Resumed:
        headers = {
            **self.auth,
            "x-session-id": self.session_id,
            "x-resume-token": self.token if token is None else token,
            "last-event-id": self.last_event_id if last_event_id is None else last_event_id,
        }
        t0 = time.perf_counter()
        ws = await RawWebSocket.connect(self.host, self.port, self.path, headers)
        upgraded = time.perf_counter()
        if ws.status != 101:
            body = b""
            try:
                async with asyncio.timeout(2):
                    body = await ws.reader.read(4096)
            except TimeoutError:
                pass
            await ws.close()
            raise Refused(ws.status, body.decode(errors="replace"))
        headers = response_headers(ws.head)
        timing = headers.get("server-timing", "resume;dur=nan").partition("dur=")[2]
        taken = int(headers["x-client-events-received"])
        resumed = Resumed(float(timing), (upgraded - t0) * 1000, int(headers.get("x-replayed-events", "0")), taken)
        self.resumes.append(resumed)
        self.ws = ws
        self._replay_due = resumed.replayed
        self._upgraded_at = upgraded
        for data in self.sent[taken:]:  # what never reached the session, again, in order
            await ws.send_frame(OP_TEXT, data)
        return resumed

    async def send(self, event: dict[str, Any], *, lost: bool = False) -> None:
        """Send ``event``; ``lost``: as if the network lost it (sent, never delivered)."""
        data = json.dumps(event).encode()
        self.sent.append(data)
        assert self.ws is not None
        if not lost:
            await self.ws.send_frame(OP_TEXT, data)

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        assert self.ws is not None
        async with asyncio.timeout(timeout):
            while True:
                opcode, payload = await self.ws.read_frame()
                if opcode == 0x9:  # ping
                    await self.ws.send_frame(0xA, payload)
                elif opcode == OP_CLOSE:
                    raise ConnectionError(f"closed by the server: {payload[2:].decode(errors='replace')}")
                elif opcode == OP_TEXT:
                    break
        event = json.loads(payload)
        if self._replay_due:
            if self._replay_due == self.resumes[-1].replayed:
                self.resumes[-1].first_event_ms = (time.perf_counter() - self._upgraded_at) * 1000
            self._replay_due -= 1
        self.events.append(event)
        return event

    async def until(self, kind: str, timeout: float = 10.0) -> None:
        while (await self.recv(timeout))["type"] != kind:
            pass


@dataclass
class Turn:
    audio: bytes  # appended, in these chunks
    chunks: list[int]
    drop: str | None  # where this turn's connection drops (DROP_POINTS), or None
    drop_at: int  # after this many appends / response events / replayed events
    pause_s: float  # before resuming
    lost: int = 0  # an append drop: the last appends before it lost in flight (sent, never delivered)


@dataclass
class Report:
    turns: int = 0
    drops: dict[str, int] = field(default_factory=lambda: {p: 0 for p in DROP_POINTS})
    events: int = 0
    audio_bytes: int = 0
    mismatches: list[str] = field(default_factory=list)
    resumes: list[Resumed] = field(default_factory=list)


def plan(rng: random.Random, drops: int) -> list[Turn]:
    """Turns until ``drops`` drops are planned: about three in four turns drop once, at a point drawn evenly."""
    turns: list[Turn] = []
    planned = 0
    while planned < drops:
        samples = rng.randrange(RATE // 8, RATE // 2)  # 125-500 ms (a manual commit takes 100 ms or more)
        audio = rng.randbytes(samples * 2)
        chunks, left = [], samples
        while left:
            n = min(left, rng.randrange(RATE // 100, RATE // 10))  # 10-100 ms appends
            chunks.append(n * 2)
            left -= n
        drop = rng.choice(DROP_POINTS) if rng.random() < 0.75 else None
        limit = {"append": len(chunks), "response": len(expected_turn(samples)) - 1, "between": 0, "resume": 8}.get(drop or "", 0)
        drop_at = rng.randint(0, limit)
        turns.append(Turn(audio, chunks, drop, drop_at, rng.choice((0.0, 0.0, rng.uniform(0, 0.05))), rng.randint(0, min(drop_at, 3))))
        planned += drop is not None
    return turns


async def _resume(client: ResumingClient, turn: Turn, report: Report) -> None:
    """Resume after the pause; a ``resume`` drop drops again right after the upgrade (having read
    ``drop_at`` events at most), and resumes once more."""
    await asyncio.sleep(turn.pause_s)
    resumed = await client.resume()
    if turn.drop == "resume":
        for _ in range(min(turn.drop_at, resumed.replayed)):
            await client.recv()
        client.drop()
        await asyncio.sleep(turn.pause_s)
        resumed = await client.resume()
    report.resumes.extend(client.resumes[-2:] if turn.drop == "resume" else client.resumes[-1:])


async def play(client: ResumingClient, turn: Turn, report: Report) -> None:
    """One turn, with its drop (if any) where the plan says."""
    sent = 0
    for n, size in enumerate(turn.chunks):
        if turn.drop == "append" and n == turn.drop_at:
            client.drop()
            await _resume(client, turn, report)
        chunk = turn.audio[sent : sent + size]
        # the appends just before an append drop were in flight: lost with the connection
        lost = turn.drop == "append" and turn.drop_at - turn.lost <= n < turn.drop_at
        await client.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}, lost=lost)
        sent += size
    if turn.drop == "append" and turn.drop_at == len(turn.chunks):
        client.drop()
        await _resume(client, turn, report)
    await client.send({"type": "input_audio_buffer.commit"})
    await client.send({"type": "response.create"})
    if turn.drop in ("response", "resume"):
        for _ in range(turn.drop_at):
            await client.recv()
        client.drop()
        await _resume(client, turn, report)
    await client.until("response.done")
    if turn.drop == "between":
        client.drop()
        await _resume(client, turn, report)
    if turn.drop:
        report.drops[turn.drop] += 1


def check(client: ResumingClient, turns: list[Turn], report: Report) -> None:
    """The client's events against the model: ids consecutive once each, each turn's events and audio."""
    events = client.events
    numbers = [event_number(e["event_id"]) for e in events]
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))) or numbers[0] != 1:
        dup = len(numbers) - len(set(numbers))
        report.mismatches.append(f"event ids not 1..{len(numbers)} once each ({dup} repeated; first {numbers[0]})")
    head = [e["type"] for e in events[:2]]
    if head != ["session.created", "conversation.created"] or sum(e["type"] == "session.created" for e in events) != 1:
        report.mismatches.append(f"the session began {head}, with {sum(e['type'] == 'session.created' for e in events)} session.created")
    at = 2  # after session.created and conversation.created (the config sets the session: no update)
    for n, turn in enumerate(turns):
        want = expected_turn(len(turn.audio) // 2)
        got = events[at : at + len(want)]
        types = [e["type"] for e in got]
        if types != want:
            report.mismatches.append(f"turn {n} (drop {turn.drop} at {turn.drop_at}): events {_diff(types, want)}")
            return  # the rest would be off by the same
        audio = b"".join(base64.b64decode(e["delta"]) for e in got if e["type"] == "response.output_audio.delta")
        if audio != turn.audio:
            report.mismatches.append(f"turn {n} (drop {turn.drop} at {turn.drop_at}): answer audio {len(audio)} bytes, appended {len(turn.audio)}, equal: {audio == turn.audio}")
        status = got[-1]["response"]["status"]
        if status != "completed":
            report.mismatches.append(f"turn {n}: response {status}")
        report.audio_bytes += len(audio)
        at += len(want)
    if at != len(events):
        report.mismatches.append(f"{len(events) - at} events after the last turn: {[e['type'] for e in events[at:at + 5]]}")
    report.events = len(events)


def _diff(got: list[str], want: list[str]) -> str:
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"differ at {i}: got {got[i:i + 3]}, want {want[i:i + 3]} ({len(got)} vs {len(want)})"


async def run(host: str, port: int, *, drops: int, seed: int, api_key: str = "bench") -> Report:
    """One session through ``drops`` drops on the server at ``host:port`` (configured as
    ``server_config``), checked; the report."""
    rng = random.Random(seed)
    turns = plan(rng, drops)
    report = Report(turns=len(turns))
    client = ResumingClient(host, port, api_key=api_key)
    await client.open()
    for turn in turns:
        await play(client, turn, report)
    await client.close()
    check(client, turns, report)
    return report


def merged(reports: list[Report]) -> Report:
    """Several sessions' reports as one (their turns, drops, events, mismatches and resumes summed)."""
    out = Report()
    for r in reports:
        out.turns += r.turns
        out.events += r.events
        out.audio_bytes += r.audio_bytes
        out.mismatches += r.mismatches
        out.resumes += r.resumes
        for point, count in r.drops.items():
            out.drops[point] += count
    return out


def summary(report: Report) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        values = sorted(values)
        return {"median": round(statistics.median(values), 3), "p90": round(values[int(0.9 * (len(values) - 1))], 3), "n": len(values)}

    return {
        "turns": report.turns,
        "drops": report.drops,
        "resumes": len(report.resumes),
        "events": report.events,
        "audio_bytes_checked": report.audio_bytes,
        "mismatches": report.mismatches,
        "server_ms": stats([r.server_ms for r in report.resumes]),
        "upgrade_ms": stats([r.upgrade_ms for r in report.resumes]),
        "first_replayed_event_ms": stats([r.first_event_ms for r in report.resumes if r.first_event_ms is not None]),
    }


def _rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _sessions_active(http: str) -> int:
    with urllib.request.urlopen(f"{http}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("realtime_sessions_active "):
                return int(float(line.split()[1]))
    return -1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench resume", description=__doc__.split("\n\n")[0])
    parser.add_argument("--drops", type=int, default=200, help="connections dropped (and resumed), in all")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--per-session", type=int, default=250, help="drops in one session at most (about 340 turns: under the 512 a session's 1024 items hold)"
    )
    args = parser.parse_args(argv)
    reports: list[Report] = []
    with server_process(server_config()) as url:
        parts = urllib.parse.urlsplit(url)
        rss_before = _rss_mib(url.process.pid)
        left, n = args.drops, 0
        while left > 0:
            drops = min(left, args.per_session)
            reports.append(asyncio.run(run(parts.hostname or "127.0.0.1", parts.port or 80, drops=drops, seed=args.seed * 1000 + n)))
            print(json.dumps(summary(reports[-1])))
            left, n = left - drops, n + 1
        http = f"http://{parts.hostname}:{parts.port}"
        deadline = time.monotonic() + 10
        while (active := _sessions_active(http)) and time.monotonic() < deadline:
            time.sleep(0.1)
        server = {"sessions_active_after": active, "rss_mib_before": rss_before, "rss_mib_after": _rss_mib(url.process.pid)}
    results = [summary(r) for r in reports]
    total = {"args": vars(args), "machine": machine(), "sessions": results, "all": summary(merged(reports)), "server": server}
    print(json.dumps({"all": total["all"], "server": server}))
    print(f"saved {save('resume', total)}")
    return 1 if any(r["mismatches"] for r in results) or server["sessions_active_after"] else 0


if __name__ == "__main__":
    sys.exit(main())
