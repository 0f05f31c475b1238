"""A generative fuzzer for the Realtime API over WebSocket: seeded, reproducible, self-checking.

Each of ``--connections`` workers holds one session (half of them in beta spelling) and sends it
batches of generated frames (``bench/fuzz_gen.py``: valid events in odd orders, mutated fields,
broken JSON, binary frames, deep nesting). After every batch the *same* connection must still
complete a turn, and the server must stay healthy:

* the connection is still open (a close, or a TCP drop, is a *lost connection*);
* a reset to known settings, then a text turn, gets ``response.done`` status ``completed`` within
  ``--turn-timeout`` seconds (otherwise the session is *stuck*);
* no ``server_error`` event (a handler's own defect, reported to the client);
* the server's log has no traceback and no ERROR line; ``/healthz`` answers 200.

A failing batch is replayed alone on fresh connections and shrunk (delta debugging) to the fewest
frames that still fail; the reproducer is printed and saved (``--replay FILE`` runs it again).

    python -m bench.fuzz --events 1000000 --seed 1            # spawns a synthetic server
    python -m bench.fuzz --url ws://127.0.0.1:8000/v1 --log server.log --events 20000

``run()`` is the library entry the CI test uses (tests/protocol/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import json
import re
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fuzz_gen import Frame, Generator

RESET_GA = {
    "type": "realtime",
    "instructions": "fuzz check",
    "output_modalities": ["audio"],
    "audio": {
        "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
        "output": {"format": {"type": "audio/pcm", "rate": 24000}},
    },
    "tools": [],
    "tool_choice": "auto",
    "max_output_tokens": "inf",
}
CHECK_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fuzz check"}]}
BAD_LOG = re.compile(r"Traceback|\bERROR\b|\bCRITICAL\b")


class Failure(Exception):
    """What went wrong after a batch: a lost connection, a stuck session, a server_error, a
    traceback in the log, an unhealthy server."""


@dataclass
class Stats:
    frames: int = 0
    bytes: int = 0
    batches: int = 0
    turns: int = 0
    kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    types: collections.Counter[str] = field(default_factory=collections.Counter)
    server_events: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "bytes": self.bytes,
            "batches": self.batches,
            "turns_checked": self.turns,
            "frame_kinds": dict(self.kinds),
            "error_codes": dict(self.errors.most_common()),
            "server_events": self.server_events,
            "server_event_types": dict(sorted(self.types.items())),
            "failures": len(self.failures),
        }


class Conn:
    """One fuzzed session: a websockets connection and a reader that keeps what the checks need."""

    def __init__(self, url: str, beta: bool, api_key: str | None) -> None:
        self.url, self.beta, self.api_key = url, beta, api_key
        self.ws: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.events: list[dict[str, Any]] = []  # since the last check, without audio deltas
        self.arrived = asyncio.Event()
        self.closed: str | None = None
        self.errors: collections.Counter[str] = collections.Counter()
        self.types: collections.Counter[str] = collections.Counter()  # server event types (coverage)
        self.count = 0

    async def open(self) -> None:
        from websockets.asyncio.client import connect

        headers = {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if self.beta:
            headers["OpenAI-Beta"] = "realtime=v1"
        self.ws = await connect(f"{self.url.rstrip('/')}/realtime?model=fuzz", additional_headers=headers, max_size=None, open_timeout=30, ping_interval=None)
        self.reader = asyncio.create_task(self._read())
        await self.wait(lambda e: e["type"] == "conversation.created", 10)

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self.ws:
                self.count += 1
                if message.startswith('{"type":"response.output_audio.delta"') or message.startswith('{"type":"response.audio.delta"'):
                    self.types["response.output_audio.delta"] += 1
                    continue
                event = json.loads(message)
                self.types[event["type"]] += 1
                if event["type"] == "response.done":
                    self.types["response.done:" + event["response"]["status"]] += 1
                if event["type"] == "error":
                    self.errors[event["error"].get("code") or "none"] += 1
                self.events.append(event)
                self.arrived.set()
        except ConnectionClosed as exc:
            self.closed = f"closed: code {exc.rcvd.code if exc.rcvd else 'none (no close frame)'} {exc.rcvd.reason if exc.rcvd else ''}".strip()
        except Exception as exc:  # noqa: BLE001 - anything the wire throws at the reader is the finding
            self.closed = f"reader failed: {type(exc).__name__}: {exc}"
        else:
            self.closed = "closed by the server"
        self.arrived.set()

    async def send(self, frame: Frame) -> None:
        if self.closed:
            raise Failure(f"lost connection ({self.closed})")
        try:
            await self.ws.send(frame.data)
        except Exception as exc:  # noqa: BLE001
            raise Failure(f"lost connection while sending ({type(exc).__name__}: {exc})") from None

    async def wait(self, predicate: Callable[[dict[str, Any]], bool], timeout: float, since: int = 0) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        seen = since
        while True:
            for event in self.events[seen:]:
                if predicate(event):
                    return event
            seen = len(self.events)
            if self.closed:
                raise Failure(f"lost connection ({self.closed})")
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), left)

    async def check_turn(self, n: int, timeout: float) -> None:
        """Reset to known settings, then one text turn must complete on this same connection."""
        mark = f"check{n}"
        for event in ({"type": "response.cancel"}, {"type": "output_audio_buffer.clear"}, {"type": "session.update", "session": RESET_GA}, {"type": "input_audio_buffer.clear"}):
            await self.send(Frame("check", json.dumps(event)))
        await self.send(Frame("check", json.dumps({"type": "conversation.item.create", "item": CHECK_ITEM})))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for attempt in range(20):
            since = len(self.events)
            create = {"type": "response.create", "event_id": f"{mark}-{attempt}", "response": {"metadata": {"fuzz": mark}, "output_modalities": ["audio"] if not self.beta else None}}
            if self.beta:
                create["response"] = {"metadata": {"fuzz": mark}, "modalities": ["text", "audio"]}
            await self.send(Frame("check", json.dumps(create)))
            try:
                got = await self.wait(
                    lambda e: (e["type"] == "response.created" and (e["response"].get("metadata") or {}).get("fuzz") == mark)
                    or (e["type"] == "error" and e["error"].get("event_id") == create["event_id"]),
                    max(0.1, deadline - loop.time()),
                    since,
                )
            except TimeoutError:
                raise Failure(f"stuck session: no response.created within {timeout:g} s of the check's response.create") from None
            if got["type"] == "error":
                if got["error"].get("code") != "conversation_already_has_active_response":
                    raise Failure(f"the check's response.create was refused: {got['error']}")
                # a fuzzed response still running (e.g. out of band, or just started): cancel it and retry
                await self.send(Frame("check", json.dumps({"type": "response.cancel"})))
                await asyncio.sleep(0.02 * (attempt + 1))
                continue
            rid = got["response"]["id"]
            try:
                done = await self.wait(lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, max(0.1, deadline - loop.time()), since)
            except TimeoutError:
                raise Failure(f"stuck session: response {rid} got no response.done within {timeout:g} s") from None
            status = done["response"]["status"]
            if status != "completed":
                raise Failure(f"the check's response ended {status}: {done['response'].get('status_details')}")
            server_errors = [e for e in self.events if e["type"] == "error" and e["error"].get("type") == "server_error" and e["error"].get("code") != "conversation_already_has_active_response"]
            if server_errors:
                raise Failure(f"server_error event: {server_errors[0]['error']}")
            self.events.clear()
            return
        raise Failure("stuck session: a response stayed active through 20 cancels")

    async def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close()
        if self.reader is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.reader, 5)


class LogWatch:
    """New lines of the server log with a traceback or an ERROR, since the last look."""

    def __init__(self, path: Path | None = None, lines: Callable[[], list[str]] | None = None) -> None:
        self.path, self._lines = path, lines
        self.offset = path.stat().st_size if path and path.exists() else 0

    def new_problems(self) -> list[str]:
        if self._lines is not None:
            text = self._lines()
        elif self.path is not None and self.path.exists():
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
                self.offset += len(data)
            text = data.decode(errors="replace").splitlines()
        else:
            return []
        return [line for line in text if BAD_LOG.search(line)]


def healthz(url: str) -> int:
    http = url.replace("ws://", "http://").replace("wss://", "https://").rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(f"{http}/healthz", timeout=5) as r:
            return r.status
    except OSError as exc:
        return getattr(exc, "code", 0) or 0


async def run_batch(conn: Conn, frames: list[Frame], n: int, timeout: float, stats: Stats | None = None) -> None:
    for frame in frames:
        await conn.send(frame)
        if stats is not None:
            stats.frames += 1
            stats.bytes += frame.size()
            stats.kinds[frame.kind] += 1
    await conn.check_turn(n, timeout)


async def _reproduces(url: str, beta: bool, api_key: str | None, frames: list[Frame], logs: LogWatch, timeout: float) -> str | None:
    """Does ``frames`` alone, on a fresh connection, fail? The failure, or None."""
    logs.new_problems()
    conn = Conn(url, beta, api_key)
    try:
        await conn.open()
        await run_batch(conn, frames, 0, timeout)
    except Failure as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    finally:
        await conn.close()
    await asyncio.sleep(0.05)
    problems = logs.new_problems()
    if problems:
        return f"server log: {problems[0][:300]}"
    return None


async def minimise(url: str, beta: bool, api_key: str | None, frames: list[Frame], logs: LogWatch, timeout: float, budget_s: float = 120.0) -> tuple[list[Frame], str | None]:
    """Delta debugging (ddmin) of a failing batch, within a time budget: the smallest run of frames
    found that still fails alone, and its failure (None when the batch does not fail alone: it
    needed the connection's earlier history or other connections)."""
    failure = await _reproduces(url, beta, api_key, frames, logs, timeout)
    if failure is None:
        return frames, None
    end = time.monotonic() + budget_s
    n = 2
    while len(frames) >= 2 and time.monotonic() < end:
        chunk = max(1, len(frames) // n)
        subsets = [frames[i : i + chunk] for i in range(0, len(frames), chunk)]
        reduced = False
        for i in range(len(subsets)):
            if time.monotonic() > end:
                break
            for candidate in (subsets[i], [f for j, s in enumerate(subsets) if j != i for f in s]):
                if len(candidate) < len(frames):
                    got = await _reproduces(url, beta, api_key, candidate, logs, timeout)
                    if got is not None:
                        frames, failure, reduced = candidate, got, True
                        break
            if reduced:
                break
        if reduced:
            n = 2 if len(frames) < 4 else max(n - 1, 2)
        elif n >= len(frames):
            break
        else:
            n = min(len(frames), n * 2)
    return frames, failure


def write_reproducer(path: Path, frames: list[Frame], beta: bool, failure: str | None, origin: dict[str, Any]) -> None:
    data = {
        "beta": beta,
        "failure": failure,
        "origin": origin,
        "frames": [
            {"kind": f.kind, "text": f.data} if isinstance(f.data, str) else {"kind": f.kind, "bytes_b64": base64.b64encode(f.data).decode()}
            for f in frames
        ],
    }
    path.write_text(json.dumps(data, indent=1))


def read_reproducer(path: Path) -> tuple[list[Frame], bool]:
    data = json.loads(path.read_text())
    frames = [Frame(f["kind"], f["text"] if "text" in f else base64.b64decode(f["bytes_b64"])) for f in data["frames"]]
    return frames, data["beta"]


async def run(
    url: str,
    *,
    events: int,
    seed: int = 1,
    connections: int = 4,
    batch: int = 200,
    logs: LogWatch | None = None,
    api_key: str | None = None,
    turn_timeout: float = 10.0,
    huge: bool = True,
    speech: bytes | None = None,
    minimise_budget_s: float = 120.0,
    out_dir: Path | None = None,
    progress: Callable[[Stats], None] | None = None,
    max_failures: int = 5,
) -> Stats:
    """Send ``events`` generated frames over ``connections`` sessions, checking after every batch."""
    logs = logs or LogWatch()
    stats = Stats()
    per_worker = [events // connections + (1 if i < events % connections else 0) for i in range(connections)]
    lock = asyncio.Lock()

    async def fail(worker: int, beta: bool, batch_no: int, frames: list[Frame], why: str) -> None:
        async with lock:  # one minimisation at a time, so log lines belong to it
            small, failure = await minimise(url, beta, api_key, frames, logs, turn_timeout, minimise_budget_s)
            record = {
                "worker": worker,
                "beta": beta,
                "batch": batch_no,
                "seed": seed,
                "failure": why,
                "reproduces_alone": failure is not None,
                "minimal_failure": failure,
                "frames": [f.short(300) for f in small],
            }
            if out_dir is not None:
                out_dir.mkdir(parents=True, exist_ok=True)
                path = out_dir / f"fuzz-repro-s{seed}-w{worker}-b{batch_no}.json"
                write_reproducer(path, small, beta, failure, {"seed": seed, "worker": worker, "batch": batch_no})
                record["file"] = str(path)
            stats.failures.append(record)
            print_failure(record)

    async def worker(index: int) -> None:
        beta = index % 2 == 1
        gen = Generator(seed * 1000 + index, beta=beta, speech=speech, huge=huge)
        conn = Conn(url, beta, api_key)
        await conn.open()
        left, batch_no = per_worker[index], 0
        try:
            while left > 0 and len(stats.failures) < max_failures:
                frames = [gen.next() for _ in range(min(batch, left))]
                left -= len(frames)
                batch_no += 1
                why = None
                try:
                    await run_batch(conn, frames, batch_no, turn_timeout, stats)
                    stats.turns += 1
                except Failure as exc:
                    why = str(exc)
                problems = logs.new_problems()
                if why is None and problems:
                    why = f"server log: {problems[0][:300]}"
                if why is None and healthz(url) != 200:
                    why = "/healthz is not 200"
                stats.batches += 1
                if why is not None:
                    await fail(index, beta, batch_no, frames, why)
                    stats.errors.update(conn.errors)
                    stats.types.update(conn.types)
                    await conn.close()
                    conn = Conn(url, beta, api_key)  # go on with a fresh session
                    await conn.open()
                if progress is not None:
                    progress(stats)
        finally:
            stats.errors.update(conn.errors)
            stats.types.update(conn.types)
            stats.server_events += conn.count
            await conn.close()

    await asyncio.gather(*(worker(i) for i in range(connections)))
    return stats


def print_failure(record: dict[str, Any]) -> None:
    print(f"\nFAILURE (seed {record['seed']}, worker {record['worker']}, batch {record['batch']}, beta={record['beta']}): {record['failure']}", file=sys.stderr)
    if record["reproduces_alone"]:
        print(f"  minimal reproducer ({len(record['frames'])} frames, fails with: {record['minimal_failure']}):", file=sys.stderr)
    else:
        print("  the batch does not fail alone on a fresh connection; its frames:", file=sys.stderr)
    for f in record["frames"][:40]:
        print(f"    {f}", file=sys.stderr)
    if "file" in record:
        print(f"  replay: python -m bench.fuzz --url <ws url> --replay {record['file']}", file=sys.stderr)


def synthetic_server_config() -> dict[str, Any]:
    from realtime_omni import config as config_file

    cfg = config_file.raw("synthetic")
    cfg["limits"] = {**cfg.get("limits", {}), "max_sessions": 64}
    # answers that take a while (about 30 chunks 4 ms apart), so events land mid-response
    cfg["pipeline"]["options"].update(first_chunk_ms=2, chunk_interval_ms=4)
    return cfg


def _speech() -> bytes | None:
    try:
        from bench.audio import espeak

        return espeak("Hello, could you tell me the time please?").astype("<i2").tobytes()
    except Exception:  # noqa: BLE001 - no espeak-ng: the generator makes a speech-like sound
        return None


async def _replay(url: str, path: Path, api_key: str | None, logs: LogWatch, timeout: float) -> int:
    frames, beta = read_reproducer(path)
    failure = await _reproduces(url, beta, api_key, frames, logs, timeout)
    print(f"{len(frames)} frames: " + (f"FAILS: {failure}" if failure else "passes"))
    return 1 if failure else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="ws base URL of a running server (default: spawn a synthetic one)")
    parser.add_argument("--log", type=Path, help="that server's log file, watched for tracebacks")
    parser.add_argument("--api-key")
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--turn-timeout", type=float, default=10.0)
    parser.add_argument("--no-huge", action="store_true", help="no 1 MiB strings")
    parser.add_argument("--replay", type=Path, help="send a saved reproducer and report whether it fails")
    args = parser.parse_args(argv)
    from bench.common import RESULTS, machine, save, server_process

    with contextlib.ExitStack() as stack:
        url, log = args.url, args.log
        if url is None:
            url = stack.enter_context(server_process(synthetic_server_config(), startup_s=120))
            log = url.log
        logs = LogWatch(log)
        if args.replay:
            return asyncio.run(_replay(url, args.replay, args.api_key, logs, args.turn_timeout))
        t0 = time.monotonic()
        last = [t0]

        def progress(s: Stats) -> None:
            if time.monotonic() - last[0] > 10:
                last[0] = time.monotonic()
                print(f"  {s.frames} frames, {s.batches} batches, {time.monotonic() - t0:.0f} s, {len(s.failures)} failures", flush=True)

        stats = asyncio.run(
            run(
                url,
                events=args.events,
                seed=args.seed,
                connections=args.connections,
                batch=args.batch,
                logs=logs,
                api_key=args.api_key,
                turn_timeout=args.turn_timeout,
                huge=not args.no_huge,
                speech=_speech(),
                out_dir=RESULTS,
                progress=progress,
            )
        )
        elapsed = time.monotonic() - t0
        result = {
            "command": "python -m bench.fuzz " + " ".join(argv if argv is not None else sys.argv[1:]),
            "seed": args.seed,
            "seconds": round(elapsed, 1),
            "frames_per_second": round(stats.frames / elapsed, 1),
            **stats.summary(),
            "failure_records": stats.failures,
            "healthz": healthz(url),
            "machine": machine(),
        }
    path = save("fuzz", result)
    print(json.dumps({k: v for k, v in result.items() if k != "failure_records"}, indent=1))
    print(f"saved {path}")
    return 1 if stats.failures else 0


if __name__ == "__main__":
    sys.exit(main())
