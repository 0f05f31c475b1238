"""Redis killed under load through the balancer: no session lost, no key spent twice, every refusal a clear 503.

nginx (deploy/nginx.conf) in front of two replicas sharing a redis-server, as ``bench.cluster``
starts them, on the synthetic pipeline answering in text. ``--sessions`` Realtime sessions, opened
through nginx with the API key, talk for the whole run: every ``--round-ms`` each sends
``conversation.item.create`` (a user message naming the session and the round) and
``response.create`` (text), every fifth round a ``session.update`` first, and reads its answer to
``response.done``, which must be ``completed`` and echo that round's words. Beside them,
``--key-workers`` clients churn keys, each in a loop: mint an ephemeral key through nginx
(``POST /v1/realtime/client_secrets``), race two WebSocket handshakes with it (least_conn sends them
to both replicas), and open (and close) a session with the API key. Each replica's ``/healthz`` is
polled every 200 ms.

After ``--before-s`` Redis is killed (SIGKILL) for ``--outage-s``; then an empty redis-server is
started on its port (no persistence: the keys minted before are gone with the old one), and the
run goes on for ``--after-s`` once both replicas are healthy again, neither restarted. At the end
every key minted is tried once more (a key that opens a second session was spent twice), the
sessions close, and the replicas' session slots in Redis must come back to 0 (the heartbeat mends
the releases Redis missed).

Every request is counted in the phase it began in: ``before``, ``outage`` (Redis dead),
``recovering`` (Redis back, a replica not yet healthy) and ``after``. A refusal is clear when it is
a 503 whose body says ``server_unavailable`` (a WebSocket handshake with an ephemeral key, a mint),
an API-key session told ``server_unavailable`` in an ``error`` event and closed 1013, or a 401 that
something explains: its key opened a session on the other handshake of the race, or the key was
minted before the new Redis started (lost with the old one). Anything else (a 500, a 502 from
nginx, a reset, a timeout, an unexplained 401) is listed under ``unclear``.

    python -m bench redis_outage --sessions 50 --outage-s 30

``measure()`` is the library entry the test uses (tests/bench/test_redis_outage.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import redis.asyncio as aioredis
import websockets

from .cluster import Cluster, cluster, missing, redis_server
from .common import ServerURL, machine, save
from .metrics import dist

API_KEY = "sk-redis-outage"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PHASES = ("before", "outage", "recovering", "after")
ROUND_TIMEOUT_S = 10.0  # a text answer of the synthetic pipeline takes milliseconds
OPEN_TIMEOUT_S = 10.0
HEALTH_EVERY_S = 0.2
SWEEP_AT_ONCE = 16
UNCLEAR_KEPT = 20  # examples of unclear refusals kept in the report


@dataclass
class Options:
    sessions: int = 50
    outage_s: float = 30.0
    before_s: float = 5.0
    after_s: float = 10.0
    round_ms: float = 500.0
    key_workers: int = 2
    key_interval_ms: float = 200.0
    healthy_within_s: float = 15.0  # Redis back: how long the replicas may take to say so


def config(sessions: int) -> dict[str, Any]:
    return {
        "pipeline": {"kind": "synthetic", "options": {"reply": "You said {heard}."}},
        "api_key": API_KEY,
        "web_demo": False,
        "shutdown_grace_s": 2.0,
        "limits": {"max_sessions": sessions + 100, "key_mints_per_s": 1000.0, "key_mint_burst": 1000},
        "session": {"audio": {"input": {"transcription": None}}},
    }


@dataclass
class Clock:
    """When the outage began and ended; a request belongs to the phase it began in."""

    killed: float = float("inf")
    restarted: float = float("inf")
    healthy: float = float("inf")

    def phase(self, t: float) -> str:
        if t < self.killed:
            return "before"
        if t < self.restarted:
            return "outage"
        return "recovering" if t < self.healthy else "after"


@dataclass
class Key:
    value: str
    minted: float  # monotonic
    opened: int = 0
    refusals: list[tuple[float, str]] = field(default_factory=list)  # (when, outcome)


@dataclass
class Record:
    """Everything the clients saw, with when each thing began."""

    clock: Clock = field(default_factory=Clock)
    rounds: list[tuple[float, float]] = field(default_factory=list)  # (began, round trip ms)
    lost: list[dict[str, Any]] = field(default_factory=list)
    opened: int = 0
    open_failed: list[str] = field(default_factory=list)
    rounds_in: dict[int, Counter[str]] = field(default_factory=dict)  # session -> phase -> rounds
    mints: list[tuple[float, str]] = field(default_factory=list)  # (began, outcome)
    keys: list[Key] = field(default_factory=list)
    redemptions: list[tuple[float, str, Key]] = field(default_factory=list)
    api_sessions: list[tuple[float, str]] = field(default_factory=list)
    health: dict[int, list[tuple[float, int, bool]]] = field(default_factory=dict)  # replica -> (when, status, degraded)
    sweep: Counter[str] = field(default_factory=Counter)  # the last try of every key: outcome -> keys
    sessions_after: int = -1  # the replicas' open sessions once every client closed
    slots_after: int = -1  # the session slots Redis counts then (-1: Redis never came back)
    replicas_restarted: int = 0


def _refusal(status: int, body: bytes | str) -> str:
    """``"503 server_unavailable"``: a refusal's status and the error code its body gives."""
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = "no error body"
    return f"{status} {code}"


# ---------------------------------------------------------------------------------- sessions


async def talk(c: Cluster, i: int, rec: Record, opening: asyncio.Semaphore, stop: asyncio.Event, opts: Options) -> None:
    """One session through nginx (opened while holding ``opening``), a round every ``round_ms``
    until ``stop``; lost on anything but a completed answer to each round."""
    try:
        async with opening:
            ws = await websockets.connect(f"{c.ws}/realtime", additional_headers=AUTH, open_timeout=OPEN_TIMEOUT_S, max_size=None)
            first = json.loads(await asyncio.wait_for(ws.recv(), OPEN_TIMEOUT_S))
        if first["type"] != "session.created":
            await ws.close()
            rec.open_failed.append(f"session {i}: {first['type']} {first.get('error', {}).get('code')}")
            return
    except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as exc:
        rec.open_failed.append(f"session {i}: {type(exc).__name__}: {exc}")
        return
    rec.opened += 1
    loop = asyncio.get_running_loop()
    counts = rec.rounds_in.setdefault(i, Counter())
    k = 0
    try:
        await asyncio.sleep(opts.round_ms / 1000 * i / opts.sessions)  # spread the rounds
        while not stop.is_set():
            k += 1
            began = loop.time()
            if k % 5 == 1:
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": f"Round {k}."}}))
            words = f"hello s{i} r{k}"
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": words}]}
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
            done = await asyncio.wait_for(_response_done(ws), ROUND_TIMEOUT_S)
            if '"status":"completed"' not in done or words not in done:
                raise _Lost(f"round {k}: response.done not completed with its words: {done[:300]}")
            rec.rounds.append((began, (loop.time() - began) * 1000))
            counts[rec.clock.phase(began)] += 1
            await asyncio.sleep(max(0.0, began + opts.round_ms / 1000 - loop.time()))
    except _Lost as lost:
        rec.lost.append({"session": i, "phase": rec.clock.phase(loop.time()), "reason": str(lost)})
    except asyncio.TimeoutError:
        rec.lost.append({"session": i, "phase": rec.clock.phase(loop.time()), "reason": f"round {k}: no response.done within {ROUND_TIMEOUT_S:g} s"})
    except (OSError, websockets.WebSocketException) as exc:
        rec.lost.append({"session": i, "phase": rec.clock.phase(loop.time()), "reason": f"round {k}: {type(exc).__name__}: {exc}"})
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ws.close(), 5)


class _Lost(Exception):
    pass


async def _response_done(ws: Any) -> str:
    while True:
        msg = await ws.recv()
        if msg.startswith('{"type":"response.done"'):
            return str(msg)
        if msg.startswith('{"type":"error"'):
            raise _Lost(f"error event: {msg[:300]}")


# ---------------------------------------------------------------------------------- keys


async def redeem(c: Cluster, key: Key, rec: Record) -> str:
    """One WebSocket handshake through nginx with an ephemeral key: ``opened``, or the refusal."""
    began = time.monotonic()
    try:
        async with websockets.connect(f"{c.ws}/realtime", additional_headers={"Authorization": f"Bearer {key.value}"}, open_timeout=OPEN_TIMEOUT_S) as ws:
            first = json.loads(await asyncio.wait_for(ws.recv(), OPEN_TIMEOUT_S))
            outcome = "opened" if first["type"] == "session.created" else f"accepted, then {first['type']} {first.get('error', {}).get('code')}"
    except websockets.InvalidStatus as err:
        outcome = _refusal(err.response.status_code, err.response.body or b"")
    except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    if outcome == "opened":
        key.opened += 1
    else:
        key.refusals.append((began, outcome))
    rec.redemptions.append((began, outcome, key))
    return outcome


async def api_key_session(c: Cluster, rec: Record) -> None:
    """A new session with the API key: ``opened``, or refused in the protocol (an ``error``
    event, then close 1013)."""
    began = time.monotonic()
    try:
        async with websockets.connect(f"{c.ws}/realtime", additional_headers=AUTH, open_timeout=OPEN_TIMEOUT_S) as ws:
            first = json.loads(await asyncio.wait_for(ws.recv(), OPEN_TIMEOUT_S))
            if first["type"] == "session.created":
                outcome = "opened"
            else:
                code = first.get("error", {}).get("code")
                try:
                    await asyncio.wait_for(ws.recv(), OPEN_TIMEOUT_S)
                    outcome = f"error event {code}, not closed"
                except websockets.ConnectionClosed as closed:
                    outcome = f"error event {code}, close {closed.rcvd.code if closed.rcvd else None}"
    except websockets.InvalidStatus as err:
        outcome = _refusal(err.response.status_code, err.response.body or b"")
    except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    rec.api_sessions.append((began, outcome))


async def churn(c: Cluster, http: httpx.AsyncClient, rec: Record, stop: asyncio.Event, opts: Options) -> None:
    """Mint a key, race two handshakes with it, open a session with the API key; again."""
    while not stop.is_set():
        began = time.monotonic()
        try:
            r = await http.post(f"{c.http}/v1/realtime/client_secrets", json={})
            outcome = "200" if r.status_code == 200 else _refusal(r.status_code, r.content)
        except httpx.HTTPError as exc:
            outcome, r = f"{type(exc).__name__}: {exc}", None
        rec.mints.append((began, outcome))
        if r is not None and r.status_code == 200:
            key = Key(r.json()["value"], began)
            rec.keys.append(key)
            await asyncio.gather(redeem(c, key, rec), redeem(c, key, rec))
        await api_key_session(c, rec)
        await asyncio.sleep(max(0.0, began + opts.key_interval_ms / 1000 - time.monotonic()))


async def sweep(c: Cluster, rec: Record) -> None:
    """Every key minted, tried once more now that Redis is back: none may open a second session."""
    gate = asyncio.Semaphore(SWEEP_AT_ONCE)

    async def again(key: Key) -> None:
        async with gate:
            before = key.opened
            outcome = await redeem(c, key, rec)
            rec.sweep["opened again (spent twice)" if outcome == "opened" and before else "opened" if outcome == "opened" else outcome] += 1

    await asyncio.gather(*(again(k) for k in rec.keys))


# ---------------------------------------------------------------------------------- health


async def poll_health(c: Cluster, http: httpx.AsyncClient, rec: Record, stop: asyncio.Event) -> None:
    for i in range(len(c.replicas)):
        rec.health[i] = []
    while not stop.is_set():
        for i, r in enumerate(c.replicas):
            now = time.monotonic()
            try:
                resp = await http.get(f"{r.http}/healthz", timeout=2.0)
                rec.health[i].append((now, resp.status_code, bool(resp.json().get("degraded"))))
            except (httpx.HTTPError, ValueError):
                rec.health[i].append((now, 0, False))
        if rec.clock.restarted < now and rec.clock.healthy == float("inf") and all(h[-1][1] == 200 and h[-1][0] > rec.clock.restarted for h in rec.health.values()):
            rec.clock.healthy = time.monotonic()
        await asyncio.sleep(HEALTH_EVERY_S)


# ---------------------------------------------------------------------------------- the run


async def run(c: Cluster, opts: Options) -> Record:
    """The outage under load on a started deployment ``c``; what the clients saw."""
    rec = Record()
    stop_talking, stop_churn, stop_health = asyncio.Event(), asyncio.Event(), asyncio.Event()
    port = int(c.redis_url.rsplit(":", 1)[1].split("/")[0])
    assert isinstance(c.redis_url, ServerURL)  # bench.cluster's redis_server yields its process with it
    old_redis = c.redis_url.process
    pids = [r.process.pid for r in c.replicas]
    limits = httpx.Limits(max_connections=32)
    with contextlib.ExitStack() as restarted:
        async with httpx.AsyncClient(headers=AUTH, timeout=10.0, limits=limits) as http:
            health = asyncio.create_task(poll_health(c, http, rec, stop_health))
            opening = asyncio.Semaphore(10)  # handshakes at once
            talkers = [asyncio.create_task(talk(c, i, rec, opening, stop_talking, opts)) for i in range(opts.sessions)]
            churners: list[asyncio.Task[None]] = []
            try:
                deadline = time.monotonic() + 60
                while rec.opened + len(rec.open_failed) < opts.sessions and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                churners = [asyncio.create_task(churn(c, http, rec, stop_churn, opts)) for _ in range(opts.key_workers)]
                await asyncio.sleep(opts.before_s)
                old_redis.kill()  # SIGKILL: no goodbye to its clients
                await asyncio.to_thread(old_redis.wait, 10)
                rec.clock.killed = time.monotonic()
                await asyncio.sleep(opts.outage_s)
                rec.clock.restarted = time.monotonic()
                await asyncio.to_thread(restarted.enter_context, redis_server(port))
                deadline = time.monotonic() + opts.healthy_within_s
                while rec.clock.healthy == float("inf") and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                await asyncio.sleep(opts.after_s)
            finally:
                stop_churn.set()
                await asyncio.gather(*churners)
                if rec.clock.healthy < float("inf"):
                    await sweep(c, rec)
                stop_talking.set()
                await asyncio.gather(*talkers)
                rec.sessions_after = await _wait_sessions_closed(c, http)
                if rec.clock.healthy < float("inf"):
                    rec.slots_after = await _redis_slots(port)
                stop_health.set()
                await health
        rec.replicas_restarted = sum(1 for r, pid in zip(c.replicas, pids) if r.process.poll() is not None or r.process.pid != pid)
        await asyncio.to_thread(restarted.close)
    return rec


async def _wait_sessions_closed(c: Cluster, http: httpx.AsyncClient, within_s: float = 10.0) -> int:
    deadline = time.monotonic() + within_s
    while True:
        held = 0
        for r in c.replicas:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                held += int((await http.get(f"{r.http}/healthz")).json()["sessions"])
        if held == 0 or time.monotonic() > deadline:
            return held
        await asyncio.sleep(0.1)


async def _redis_slots(port: int, within_s: float = 5.0) -> int:
    """The session slots Redis counts for the replicas, once the heartbeat has written them (0
    when every session closed, the releases it missed while down included)."""
    client = aioredis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + within_s
        while True:
            counts = await client.hgetall("realtime-omni:sessions")
            total = sum(int(v) for v in counts.values())
            if total == 0 or time.monotonic() > deadline:
                return total
            await asyncio.sleep(0.2)
    finally:
        await client.aclose()


# ---------------------------------------------------------------------------------- the report


def summarize(rec: Record, opts: Options) -> dict[str, Any]:
    clock = rec.clock
    phase = clock.phase

    def by_phase(items: list[tuple[float, str]]) -> dict[str, dict[str, int]]:
        out: dict[str, Counter[str]] = {p: Counter() for p in PHASES}
        for began, outcome in items:
            out[phase(began)][outcome] += 1
        return {p: dict(sorted(v.items())) for p, v in out.items() if v}

    restarted = min(clock.restarted, clock.healthy)
    unclear: list[str] = []
    explained_401 = Counter[str]()
    for began, outcome, key in rec.redemptions:
        if outcome == "opened" or outcome.startswith("503 server_unavailable"):
            continue
        if outcome.startswith("401 "):
            if key.opened:
                explained_401["spent: the key opened a session on the other handshake"] += 1
                continue
            if key.minted < restarted:
                explained_401["lost with the killed Redis (minted before it)"] += 1
                continue
        unclear.append(f"redemption ({phase(began)}): {outcome}")
    for began, outcome in rec.mints:
        if outcome != "200" and not outcome.startswith("503 server_unavailable"):
            unclear.append(f"mint ({phase(began)}): {outcome}")
    for began, outcome in rec.api_sessions:
        if outcome not in ("opened", "error event server_unavailable, close 1013"):
            unclear.append(f"API-key session ({phase(began)}): {outcome}")

    health = {}
    for i, polls in rec.health.items():
        degraded = [t for t, status, deg in polls if clock.killed <= t < clock.restarted and status == 503 and deg]
        ok_after = [t for t, status, _ in polls if t >= clock.restarted and status == 200]
        health[f"replica {i + 1}"] = {
            "polls_by_phase": by_phase([(t, f"{status}{' degraded' if deg else ''}") for t, status, deg in polls]),
            "degraded_seen_in_outage": bool(degraded),
            "degraded_after_kill_s": round(degraded[0] - clock.killed, 2) if degraded else None,
            "ok_after_restart_s": round(ok_after[0] - clock.restarted, 2) if ok_after else None,
            "ok_at_the_end": bool(polls) and polls[-1][1] == 200,
        }

    rtt: dict[str, list[float]] = {p: [] for p in PHASES}
    for began, ms in rec.rounds:
        rtt[phase(began)].append(ms)
    spent_twice = sum(1 for k in rec.keys if k.opened > 1)
    after_keys = [k for k in rec.keys if phase(k.minted) == "after"]
    # Redis back and both replicas healthy: nothing is refused for want of it (a 401 of a key
    # spent or lost with the old Redis is no refusal of Redis's)
    after_refused = (
        [o for b, o in rec.mints if phase(b) == "after" and o != "200"]
        + [o for b, o in rec.api_sessions if phase(b) == "after" and o != "opened"]
        + [o for b, o, _ in rec.redemptions if phase(b) == "after" and not (o == "opened" or o.startswith("401 "))]
    )
    outcomes = {
        "sessions_lost": len(rec.lost) + len(rec.open_failed),
        "sessions_talked_through_the_outage": sum(1 for c in rec.rounds_in.values() if c["outage"] > 0),
        "keys_spent_twice": spent_twice,
        "unclear_refusals": len(unclear),
        "refused_503_in_outage": sum(1 for b, o, _ in rec.redemptions if phase(b) == "outage" and o.startswith("503 "))
        + sum(1 for b, o in rec.mints if phase(b) == "outage" and o.startswith("503 ")),
        "degraded_seen_on_every_replica": all(h["degraded_seen_in_outage"] for h in health.values()),
        "ok_on_every_replica_after": clock.healthy < float("inf") and all(h["ok_at_the_end"] for h in health.values()),
        "keys_after_each_opened_once": bool(after_keys) and all(k.opened == 1 for k in after_keys),
        "refused_after": len(after_refused),
        "refused_after_examples": sorted(set(after_refused))[:5],
        "replicas_restarted": rec.replicas_restarted,
        "sessions_on_replicas_after": rec.sessions_after,
        "slots_in_redis_after": rec.slots_after,
    }
    held = (
        outcomes["sessions_lost"] == 0
        and rec.opened == opts.sessions
        and outcomes["sessions_talked_through_the_outage"] == opts.sessions
        and spent_twice == 0
        and not unclear
        and outcomes["refused_503_in_outage"] > 0
        and outcomes["degraded_seen_on_every_replica"]
        and outcomes["ok_on_every_replica_after"]
        and outcomes["keys_after_each_opened_once"]
        and not after_refused
        and outcomes["replicas_restarted"] == 0
        and outcomes["sessions_on_replicas_after"] == 0
        and outcomes["slots_in_redis_after"] == 0
    )
    return {
        "held": held,
        "outcomes": outcomes,
        "options": vars(opts),
        "timeline_s": {
            "outage": round(clock.restarted - clock.killed, 2),
            "redis_back_to_both_healthy": round(clock.healthy - clock.restarted, 2) if clock.healthy < float("inf") else None,
        },
        "sessions": {
            "opened": rec.opened,
            "open_failed": rec.open_failed[:UNCLEAR_KEPT],
            "lost": rec.lost[:UNCLEAR_KEPT],
            "rounds_by_phase": {p: len(v) for p, v in rtt.items()},
            "round_trip_ms_by_phase": {p: dist(v) for p, v in rtt.items() if v},
        },
        "mints_by_phase": by_phase(rec.mints),
        "redemptions_by_phase": by_phase([(b, o) for b, o, _ in rec.redemptions]),
        "api_key_sessions_by_phase": by_phase(rec.api_sessions),
        "keys": {"minted": len(rec.keys), "opened_once": sum(1 for k in rec.keys if k.opened == 1), "never_opened": sum(1 for k in rec.keys if not k.opened), "spent_twice": spent_twice},
        "final_sweep": dict(rec.sweep),
        "explained_401": dict(explained_401),
        "unclear": unclear[:UNCLEAR_KEPT],
        "health": health,
    }


def measure(opts: Options) -> dict[str, Any]:
    """A deployment started, the outage run under load, the report; the deployment stopped."""
    with cluster(config(opts.sessions), replicas=2) as c:
        budget = opts.before_s + opts.outage_s + opts.healthy_within_s + opts.after_s + 120  # the sweep and the closing included
        rec = asyncio.run(asyncio.wait_for(run(c, opts), budget))
    return summarize(rec, opts)


def report(result: dict[str, Any]) -> None:
    o, s = result["outcomes"], result["sessions"]
    rtt = s["round_trip_ms_by_phase"]
    print(
        f"{result['options']['sessions']} sessions, Redis down {result['timeline_s']['outage']} s, both replicas healthy "
        f"{result['timeline_s']['redis_back_to_both_healthy']} s after it returned",
        flush=True,
    )
    print(f"  sessions lost {o['sessions_lost']}; rounds by phase {s['rounds_by_phase']}; round trip p99 by phase " + str({p: d.get("p99") for p, d in rtt.items()}))
    print(f"  keys minted {result['keys']['minted']}, spent twice {o['keys_spent_twice']}; final sweep {result['final_sweep']}")
    print(f"  mints {result['mints_by_phase']}")
    print(f"  redemptions {result['redemptions_by_phase']}")
    print(f"  API-key sessions {result['api_key_sessions_by_phase']}")
    print(f"  401s explained {result['explained_401']}; unclear {o['unclear_refusals']} {result['unclear'][:5]}")
    for name, h in result["health"].items():
        print(f"  {name}: degraded {h['degraded_after_kill_s']} s after the kill, ok {h['ok_after_restart_s']} s after Redis returned; polls {h['polls_by_phase']}")
    print(f"  replicas restarted {o['replicas_restarted']}; Redis's session slots after {o['slots_in_redis_after']}; held: {result['held']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Options()
    parser.add_argument("--sessions", type=int, default=d.sessions, help="sessions talking through the run")
    parser.add_argument("--outage-s", type=float, default=d.outage_s, help="how long Redis stays dead")
    parser.add_argument("--before-s", type=float, default=d.before_s, help="load before the kill")
    parser.add_argument("--after-s", type=float, default=d.after_s, help="load after both replicas are healthy again")
    parser.add_argument("--round-ms", type=float, default=d.round_ms, help="each session's round: an item and a response")
    parser.add_argument("--key-workers", type=int, default=d.key_workers, help="clients minting and redeeming keys at once")
    parser.add_argument("--key-interval-ms", type=float, default=d.key_interval_ms, help="each key client's cycle")
    args = parser.parse_args()
    gone = missing()
    if gone:
        print(f"python -m bench redis_outage: needs {', '.join(gone)} (Debian's packages)", file=sys.stderr)
        sys.exit(2)
    if not 1 <= args.sessions <= 1000 or not 0 < args.outage_s <= 600 or args.key_workers < 1:
        parser.error("--sessions 1-1000, --outage-s up to 600, --key-workers 1 or more")
    opts = Options(args.sessions, args.outage_s, args.before_s, args.after_s, args.round_ms, args.key_workers, args.key_interval_ms)
    result = measure(opts)
    report(result)
    print("saved", save("redis_outage", {**result, "command": sys.argv, "machine": machine()}))


if __name__ == "__main__":
    main()
