"""The Redis outage bench (bench/redis_outage.py) at CI size: a real redis-server killed (SIGKILL)
for 3 s and started again on its port, under 8 sessions talking through Debian's nginx to two
replicas while keys are minted and raced: no session lost, no key spent twice, every refusal a
503 that says ``server_unavailable`` (or a 401 its race or the killed Redis explains), both
replicas degraded meanwhile and serving again after without a restart.
``python -m bench redis_outage`` is the full run (50 sessions, 30 s)."""

from __future__ import annotations

import pytest

from bench import redis_outage
from bench.cluster import missing

pytestmark = [
    pytest.mark.system,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(bool(missing()), reason=f"needs {', '.join(missing())}"),
]


def test_redis_killed_under_sessions_and_key_churn_loses_nothing_and_refuses_clearly():
    result = redis_outage.measure(redis_outage.Options(sessions=8, outage_s=3.0, before_s=2.0, after_s=2.0))
    o = result["outcomes"]
    assert result["sessions"]["opened"] == 8
    assert o["sessions_lost"] == 0, result["sessions"]
    assert o["sessions_talked_through_the_outage"] == 8, result["sessions"]["rounds_by_phase"]
    assert o["keys_spent_twice"] == 0, result["keys"]
    assert result["unclear"] == [], result["unclear"]
    # Redis dead: mints and redemptions were refused, each with a 503 saying server_unavailable
    outage = result["mints_by_phase"]["outage"]
    assert set(outage) == {"503 server_unavailable"}, outage
    assert all(k in ("503 server_unavailable", "opened") for k in result["redemptions_by_phase"].get("outage", {})), result["redemptions_by_phase"]
    assert o["degraded_seen_on_every_replica"] and o["ok_on_every_replica_after"], result["health"]
    # Redis back, the same replica processes: every mint and session works, every key opens once
    assert set(result["mints_by_phase"]["after"]) == {"200"}, result["mints_by_phase"]
    assert set(result["api_key_sessions_by_phase"]["after"]) == {"opened"}, result["api_key_sessions_by_phase"]
    assert o["keys_after_each_opened_once"] and o["refused_after"] == 0
    assert o["replicas_restarted"] == 0
    assert o["sessions_on_replicas_after"] == 0 and o["slots_in_redis_after"] == 0
    assert result["held"]
