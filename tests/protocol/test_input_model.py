"""The input side against its reference model (bench/input_model.py), at CI size: random sequences
of appends (real speech, silence, random sizes), clears, commits and turn-detection changes, each
committed item read back and compared sample for sample with what the model says it must hold.
``python -m bench.input_model --sequences 10000`` is the full run."""

from __future__ import annotations

import pytest

from bench import input_model
from tests.support.validation import validate


@pytest.fixture(scope="module")
def model_server(make_server):
    config = input_model.server_config()
    return make_server(
        **config["pipeline"]["options"], limits=config["limits"], session=config["session"], server={"turn_end": config["turn_end"]}
    )


@pytest.mark.slow
async def test_every_committed_item_holds_what_the_model_says(model_server):
    stats = await input_model.run(model_server.ws_base, sequences=300, seed=20261124, connections=2, validate=validate, out=lambda *_: None)
    assert stats["mismatches"] == [], stats["mismatches"][:3]
    expected = stats["expected"]
    # the sequences reached every kind of outcome the model knows
    for kind in ("committed:vad", "committed:commit", "committed:full", "cleared", "updated", "speech_started",
                 "error:input_audio_buffer_commit_empty", "error:input_audio_buffer_full"):  # fmt: skip
        assert expected.get(kind, 0) > 0, (kind, expected)
    assert stats["items"] >= 300


def test_the_model_is_reproducible():
    import random

    a = input_model.judged(random.Random(7))
    b = input_model.judged(random.Random(7))
    assert a[:2] == b[:2] and [x.kind for x in a[2]] == [x.kind for x in b[2]]
