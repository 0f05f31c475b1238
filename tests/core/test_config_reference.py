"""docs/config-reference.md is what ``python -m realtime_omni.config_reference`` prints: every key
of a config file, its type, default and one line, from the config types themselves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from realtime_omni import config as config_file
from realtime_omni import config_reference as reference

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "config-reference.md"
# values that are maps or lists of their own, not sections of keys: the reference lists the key itself
OPAQUE = {"session", "sip.session", "turn_end.eagerness", "pipeline.options.thinker.engine_args", "pipeline.options.in_process.engine_args"}


def test_the_committed_page_is_what_the_generator_prints():
    run = subprocess.run([sys.executable, "-m", "realtime_omni.config_reference"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert run.stdout == PAGE.read_text(), "docs/config-reference.md is out of date: python -m realtime_omni.config_reference > docs/config-reference.md"


def test_every_key_has_a_line_and_every_written_line_a_key():
    assert reference.missing_lines() == []
    assert reference.stale_lines() == []


def leaves(data: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in OPAQUE:
            out += leaves(value, f"{path}.")
        else:
            out.append(path)
    return out


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "configs").glob("*.yaml")))
def test_every_key_a_shipped_config_sets_is_in_the_reference(name: str):
    raw = config_file.raw(name)
    kind = raw["pipeline"]["kind"]
    listed = {key.path for path, _, rows in reference.sections() if "(" not in path or path.endswith(f"({kind})") for key in rows}
    assert [path for path in leaves(raw) if path not in listed] == []


def test_a_default_shown_is_the_default_a_config_gets():
    """The defaults come from the Structs' fields (and a section's own default, such as
    sip.interruption_guard's min_speech_ms=300): a config that sets nothing has them all."""
    cfg = config_file.from_dict({"pipeline": {"kind": "synthetic"}})
    shown = {key.path: key.default for _, _, rows in reference.sections() for key in rows}
    for path in ("host", "port", "limits.max_sessions", "sip.host", "sip.interruption_guard.min_speech_ms", "turn_end.fusion.with_words.bias", "webrtc.jitter_frames"):
        value: Any = cfg
        for part in path.split("."):
            value = getattr(value, part)
        assert shown[path] == msgspec.json.encode(value).decode(), path
