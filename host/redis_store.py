"""The shared state (``realtime_omni.store.Store``) in Redis, for replicas behind one balancer.

Each kind of thing is one Redis operation, so replicas racing each other need no lock:

* an ephemeral key is ``<prefix>key:<value>`` holding its grant, expiring with the key (``SET EX``);
  redeeming is ``GETDEL``: of any number of replicas racing one key exactly one gets the grant.
* the mint rate limit is one token bucket for all replicas (a script: read, refill, take, write).
* each replica's session count is a field of ``<prefix>sessions``; ``<prefix>replica:<id>`` says the
  replica is alive (a heartbeat renews it every second, for ``ALIVE_S``). Reserving a session is
  a script that sums the counts of the live replicas and adds one to its own if under the limit;
  a replica killed without a word stops counting once its alive key lapses. The heartbeat also
  writes the replica's true count, so a release lost while Redis was away is mended.
* a call is ``<prefix>call:<id>`` holding the URL of the replica that holds it.

The client is redis.asyncio with a bounded pool and short timeouts: Redis down costs a request
``TIMEOUT_S`` at most (it gets ``server_unavailable``), and ``error`` (set by a failed heartbeat,
cleared by a good one) turns ``/healthz`` 503 and new sessions away while open sessions carry on.
A failed connection closes the pool's idle ones: none of them outlives a Redis that went away.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import urllib.parse
from typing import Any

import msgspec
import redis.asyncio as redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from realtime_omni.keys import PREFIX, EphemeralKey, MintRefused
from realtime_omni.protocol import events as ev
from realtime_omni.store import SessionCount, unavailable

log = logging.getLogger(__name__)

ALIVE_S = 5  # a replica that missed this long of heartbeats no longer counts its sessions
HEARTBEAT_S = 1.0
CALL_TTL_S = 24 * 3600  # a call's entry outlives any call; a dead replica's entries lapse
TIMEOUT_S = 2.0  # one operation (a busy box's scheduler included)
CONNECTIONS = 64  # to Redis from this process; a request waits up to TIMEOUT_S for a free one

# KEYS[1] the bucket; ARGV rate, burst. Returns "0" (a token taken) or the seconds to wait.
TAKE_TOKEN = """
local now = redis.call('TIME')
now = tonumber(now[1]) + tonumber(now[2]) / 1e6
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(b[1]) or burst, tonumber(b[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
if tokens < 1 then
  if rate <= 0 then return '60' end
  return tostring((1 - tokens) / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens - 1), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], 3600)
return '0'
"""

# KEYS[1] the counts; ARGV this replica, the limit, the alive keys' prefix. Returns 1 (reserved) or 0.
RESERVE = """
local counts = redis.call('HGETALL', KEYS[1])
local total = 0
for i = 1, #counts, 2 do
  if counts[i] == ARGV[1] or redis.call('EXISTS', ARGV[3] .. counts[i]) == 1 then
    total = total + tonumber(counts[i + 1])
  else
    redis.call('HDEL', KEYS[1], counts[i])
  end
end
if total >= tonumber(ARGV[2]) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
return 1
"""


class Grant(msgspec.Struct):
    expires_at: int
    session: ev.SessionObject | None
    tenant: str | None = None


class RedisStore:
    def __init__(self, url: str, *, mint_rate: float, mint_burst: int, prefix: str = "realtime-omni:") -> None:
        self.url = url
        self.mint_rate = mint_rate
        self.mint_burst = mint_burst
        self.prefix = prefix
        self.error: str | None = "not connected yet"
        self.replica = ""
        self._replica_url: str | None = None
        self._sessions: SessionCount = lambda: 0
        pool = redis.BlockingConnectionPool.from_url(
            url, max_connections=CONNECTIONS, timeout=TIMEOUT_S, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S
        )
        self._redis = redis.Redis(connection_pool=pool)
        self._take_token = self._redis.register_script(TAKE_TOKEN)
        self._reserve = self._redis.register_script(RESERVE)
        self._heartbeat: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifetime

    async def start(self, replica: str, url: str | None, sessions: SessionCount) -> None:
        self.replica, self._replica_url, self._sessions = replica, url, sessions
        await self._beat()
        if self.error is not None:
            log.error("shared state at %s is unreachable (%s): no sessions until it answers", self._where, self.error)
        self._heartbeat = asyncio.create_task(self._beat_forever(), name="state-heartbeat")

    async def stop(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.delete(self.prefix + "replica:" + self.replica)
                pipe.hdel(self.prefix + "sessions", self.replica)
                await pipe.execute()
        except (RedisError, OSError):
            pass  # gone anyway: the alive key lapses by itself
        await self._redis.aclose()

    @property
    def _where(self) -> str:
        parts = urllib.parse.urlsplit(self.url)  # never a password into a log
        return f"{parts.hostname}:{parts.port or 6379}{parts.path}"

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            await self._beat()

    async def _beat(self) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.set(self.prefix + "replica:" + self.replica, self._replica_url or "", ex=ALIVE_S)
                pipe.hset(self.prefix + "sessions", self.replica, self._sessions())
                await pipe.execute()
        except (RedisError, OSError) as exc:
            await self._after_failure(exc)
            reason = self._reason(exc)
            if self.error is None:
                log.error("shared state unreachable: %s; refusing new sessions, open ones carry on", reason)
            self.error = reason
            return
        if self.error is not None:
            log.info("shared state at %s is reachable%s", self._where, " again" if self.error != "not connected yet" else "")
        self.error = None

    def _reason(self, exc: BaseException) -> str:
        return f"Redis at {self._where}: {type(exc).__name__}: {exc}"

    async def _call(self, op: Any) -> Any:
        """One operation; failing, it fails its own request only (the heartbeat decides whether
        the state as a whole is unreachable)."""
        try:
            return await op
        except (RedisError, OSError) as exc:
            await self._after_failure(exc)
            log.warning("shared state: %s", self._reason(exc))
            raise unavailable(self._reason(exc)) from None

    async def _after_failure(self, exc: BaseException) -> None:
        """A connection that failed may be one of many to a Redis that is gone (killed,
        restarted): the pool would hand out each idle one once more, to fail a request after
        Redis is back (redis-py skips its check for a closed connection while its maintenance
        notifications are on, as they are by default). The idle ones are closed now; they
        connect afresh when next used."""
        if isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError)):
            try:
                await self._redis.connection_pool.disconnect(inuse_connections=False)
            except (RedisError, OSError) as failed:
                log.debug("closing the idle connections to Redis: %s", failed)

    # ------------------------------------------------------------------ keys

    async def issue_key(self, ttl_s: int, session: ev.SessionObject | None, tenant: str | None = None) -> EphemeralKey:
        wait = float(await self._call(self._take_token(keys=[self.prefix + "mint"], args=[self.mint_rate, self.mint_burst])))
        if wait > 0:
            raise MintRefused(f"Ephemeral keys are being minted too fast (at most {self.mint_rate:g} a second); try again in {wait:.1f} s.", wait)
        key = EphemeralKey(PREFIX + os.urandom(24).hex(), int(time.time()) + ttl_s, session, tenant)
        grant = msgspec.json.encode(Grant(key.expires_at, session, tenant))
        await self._call(self._redis.set(self.prefix + "key:" + key.value, grant, ex=ttl_s))
        return key

    def _grant(self, value: str, data: bytes | None) -> EphemeralKey | None:
        if data is None:
            return None
        grant = msgspec.json.decode(data, type=Grant)
        return EphemeralKey(value, grant.expires_at, grant.session, grant.tenant)

    async def peek_key(self, value: str) -> EphemeralKey | None:
        return self._grant(value, await self._call(self._redis.get(self.prefix + "key:" + value)))

    async def redeem_key(self, value: str) -> EphemeralKey | None:
        return self._grant(value, await self._call(self._redis.getdel(self.prefix + "key:" + value)))

    # ------------------------------------------------------------------ sessions

    async def reserve_session(self, limit: int) -> bool:
        args: list[str | int] = [self.replica, limit, self.prefix + "replica:"]
        return bool(await self._call(self._reserve(keys=[self.prefix + "sessions"], args=args)))

    async def release_session(self) -> None:
        await self._call(self._redis.hincrby(self.prefix + "sessions", self.replica, -1))

    # ------------------------------------------------------------------ calls

    async def add_call(self, call_id: str) -> None:
        if self._replica_url:
            await self._call(self._redis.set(self.prefix + "call:" + call_id, self._replica_url, ex=CALL_TTL_S))

    async def remove_call(self, call_id: str) -> None:
        await self._call(self._redis.delete(self.prefix + "call:" + call_id))

    async def call_owner(self, call_id: str) -> str | None:
        url = await self._call(self._redis.get(self.prefix + "call:" + call_id))
        return url.decode() if url else None
