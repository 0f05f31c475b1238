"""The resume generator (bench/resume.py) at CI size: one session through 60 seeded drops at random
points (mid-append with appends lost in flight, mid-response, between turns, during a resume),
every event and every audio byte checked against its model; and the model catching a client that
does not send again what was lost. ``python -m bench resume --drops 1000`` is the full run."""

from __future__ import annotations

import pytest

from bench import resume
from tests.support.server import ServerThread


@pytest.fixture(scope="module")
def echo_server():
    srv = ServerThread(resume.server_config()).start()
    yield srv
    srv.stop()


async def test_sixty_drops_lose_and_repeat_nothing(echo_server):
    report = await resume.run("127.0.0.1", echo_server.port, drops=60, seed=20261128)
    assert report.mismatches == []
    assert sum(report.drops.values()) == 60 and all(report.drops.values())  # every kind of drop happened
    assert report.events > 60 * 10 and report.audio_bytes > 0
    assert len(report.resumes) >= 60


async def test_the_model_sees_what_a_client_that_sends_nothing_again_loses(echo_server, monkeypatch):
    resume_as_written = resume.ResumingClient.resume

    async def forgetful(self: resume.ResumingClient, **kw: object) -> resume.Resumed:
        sent, self.sent = self.sent, []  # as if it kept nothing it sent
        try:
            return await resume_as_written(self, **kw)  # type: ignore[arg-type]
        finally:
            self.sent = sent

    monkeypatch.setattr(resume.ResumingClient, "resume", forgetful)
    report = await resume.run("127.0.0.1", echo_server.port, drops=30, seed=1)
    assert report.mismatches  # (a turn short of its audio, or what follows from it)
