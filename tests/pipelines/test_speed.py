"""The CPU agent's self-check: is this machine fast enough to speak in real time?"""

from __future__ import annotations

import logging

import httpx
import pytest

from pipelines.speed import MARGIN, Speed

FASTER = "--config cpu-smollm2"


def test_an_agent_that_writes_and_speaks_fast_enough_keeps_up():
    s = Speed(thinker_tokens_per_s=24.0, talker_rtf=0.1, speech_tokens_per_s=3.6, faster=FASTER)
    assert s.load == pytest.approx(3.6 / 24 + 0.1)
    assert s.keeps_up and s.warning() is None
    assert s.report()["keeps_up"] is True and s.report()["warning"] is None
    assert s.stats()["speed_keeps_up"] == 1.0


@pytest.mark.parametrize(
    "thinker,rtf",
    [
        (4.0, 0.1),  # the thinker writes slower than the voice speaks
        (24.0, 0.8),  # the talker alone nearly fills real time
        (6.0, 0.3),  # each could, but not both on the same cores
    ],
)
def test_a_slow_machine_is_named_with_a_faster_config(thinker, rtf):
    s = Speed(thinker_tokens_per_s=thinker, talker_rtf=rtf, speech_tokens_per_s=3.6, faster=FASTER)
    assert s.load > MARGIN and not s.keeps_up
    warning = s.warning()
    assert warning and FASTER in warning and f"{thinker:.1f} tokens/s" in warning
    assert s.report()["warning"] == warning and s.stats()["speed_keeps_up"] == 0.0


async def test_the_server_reports_what_it_measured(cpu_server):
    """/healthz carries the self-check's measurements and verdict, /metrics the same numbers; the
    verdict itself depends on the machine, so only its consistency is asserted here."""
    async with httpx.AsyncClient() as http:
        health = (await http.get(cpu_server.http + "/healthz")).json()
        metrics = (await http.get(cpu_server.http + "/metrics")).text
    speed = health["speed"]
    assert speed["thinker_tokens_per_s"] > 0 and speed["talker_rtf"] > 0 and speed["speech_tokens_per_s"] > 0
    assert speed["load"] == pytest.approx(speed["speech_tokens_per_s"] / speed["thinker_tokens_per_s"] + speed["talker_rtf"], rel=1e-2)
    assert speed["keeps_up"] == (speed["load"] <= MARGIN)
    assert (speed["warning"] is None) == speed["keeps_up"]
    assert f"realtime_pipeline_speed_keeps_up {float(speed['keeps_up'])}" in metrics
    assert "realtime_pipeline_speed_thinker_tokens_per_s" in metrics
