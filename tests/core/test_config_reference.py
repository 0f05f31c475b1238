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


def _at(value: Any, path: str) -> Any:
    for part in path.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


def _written(path: str, value: Any) -> dict[str, Any]:
    out: Any = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


def test_writing_one_key_of_any_section_keeps_the_defaults_of_the_others():
    """Every nested section of the reference (pipeline kinds' included): a config that writes one
    of its keys (to its default) has every other key of the section, and of the sections within,
    at the default the reference shows: a section written in part merges onto its default (not onto
    its Struct's class defaults: sip.interruption_guard keeps min_speech_ms 300)."""
    listed = list(reference.sections())
    # sections that are off (null) unless written; the keys they require, as one would write them
    off = {key.path for _, _, rows in listed for key in rows if key.type == "section" and key.default.startswith("`null`")}
    required = {"sip.register.registrar": "192.0.2.7", "sip.register.user": "agent"}
    checked = 0
    for path, _, rows in listed:
        if path in ("", "pipeline"):  # the top level; `pipeline` only chooses the kind (its options: per kind, below)
            continue
        section, _, kind = path.partition(" (")
        kind = kind.rstrip(")") or "synthetic"
        within = [key for other, _, keys in listed if other == path or (other.startswith(section + ".") and other.endswith(f"({kind})" if "(" in path else "")) for key in keys]
        within = [key for key in within if not any(key.path.startswith(o + ".") and o != section for o in off)]  # an off section within stays off
        values = [key for key in within if key.type not in ("section", "session object") and key.default != "(required)"]
        written = next(key for key in rows if key in values)
        data = config_file.merged(_written(written.path, msgspec.json.decode(written.default)), {"pipeline": {"kind": kind}})
        for key in rows:
            if key.default == "(required)":
                data = config_file.merged(data, _written(key.path, required[key.path]))
        cfg = config_file.from_dict(data)
        for key in values:
            assert msgspec.json.encode(_at(cfg, key.path)).decode() == key.default, (f"writing {written.path}", key.path)
        checked += 1
    assert checked >= 15  # every section: sip.interruption_guard, turn_end.fusion.with_words, the pipelines' ...


def test_a_section_written_in_part_keeps_the_shipped_configs_values_and_the_defaults(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("pipeline: {kind: synthetic}\nsip:\n  interruption_guard: {grace_ms: 100}\nturn_end:\n  fusion:\n    with_words: {bias: -1.0}\n  eagerness:\n    low: {threshold: 0.7}\n")
    cfg = config_file.load(mine)
    assert (cfg.sip.interruption_guard.min_speech_ms, cfg.sip.interruption_guard.grace_ms) == (300, 100)  # the echo guard stays on
    weights = cfg.turn_end.fusion.with_words
    assert (weights.bias, weights.audio, weights.words, weights.silence_per_s, weights.listener) == (-1.0, 0.5, 0.5, 2.0, 0.25)
    eagerness = cfg.turn_end.eagerness
    assert (eagerness["low"].threshold, eagerness["low"].max_wait_ms, eagerness["medium"].threshold) == (0.7, 8000, 0.5)
    # a shipped config as the base: an override of one thinker key keeps the file's others (int8, greedy)
    cpu = config_file.load("cpu", {"pipeline": {"options": {"thinker": {"remote": {"url": "http://10.0.0.9:8001/v1"}}}}})
    shipped = config_file.raw("cpu")["pipeline"]["options"]["thinker"]
    thinker = cpu.pipeline.options.thinker  # type: ignore[attr-defined]
    assert (thinker.model, thinker.temperature) == (shipped["model"], shipped["temperature"])
    assert thinker.remote.url == "http://10.0.0.9:8001/v1" and thinker.remote.connect_timeout_s == 5.0
    # what is not a mapping is still msgspec's to judge, with the key's path
    with pytest.raises(config_file.ConfigError, match=r"sip\.interruption_guard\.grace_ms"):
        config_file.from_dict({"pipeline": {"kind": "synthetic"}, "sip": {"interruption_guard": {"grace_ms": "soon"}}})
    with pytest.raises(config_file.ConfigError, match=r"sip\.interruption_guard\.grace_mz: unknown field"):
        config_file.from_dict({"pipeline": {"kind": "synthetic"}, "sip": {"interruption_guard": {"grace_mz": 1}}})
