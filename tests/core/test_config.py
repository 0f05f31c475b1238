"""Config files: the pipeline's options typed by its kind when the file is loaded, every problem one
line naming the file and the bad key (status 2 from ``serve``, no traceback), and ``serve``'s flags
laid over the file before it is validated, once."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

import pipelines
from host import cli
from pipelines.cascade.pipeline import CascadeOptions
from pipelines.omni.pipeline import OmniOptions
from pipelines.synthetic import SyntheticOptions
from realtime_omni import config as config_file
from realtime_omni.config import ConfigError

CONFIGS = sorted(path.stem for path in config_file.SOURCE_CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_loads_with_its_options_typed(name: str):
    cfg = config_file.load(name)
    assert type(cfg.pipeline.options) is pipelines.options_type(cfg.pipeline.kind)
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # --workers hands it to spawned processes


def test_each_kind_has_its_options_struct():
    assert pipelines.options_type("cascade") is CascadeOptions
    assert pipelines.options_type("omni") is OmniOptions
    assert pipelines.options_type("synthetic") is SyntheticOptions
    with pytest.raises(pipelines.UnknownKind, match="unknown pipeline kind 'cascad'; known: cascade, omni, synthetic"):
        pipelines.options_type("cascad")


def test_typing_the_options_imports_no_engine():
    """Loading a config imports its pipeline's module for the options Struct: that must not pull in
    vLLM, torch, Whisper, Piper or ONNX Runtime (they load when the pipeline starts)."""
    heavy = ["vllm", "torch", "faster_whisper", "ctranslate2", "piper", "onnxruntime", "transformers", "vllm_omni"]
    code = (
        "import sys\nfrom realtime_omni import config\n"
        "for name in ('cpu', 'qwen3-omni', 'qwen3-omni-local', 'synthetic'): config.load(name)\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]"


def test_create_takes_the_typed_options():
    assert type(pipelines.create("synthetic", SyntheticOptions(reply="hi"))).__name__ == "SyntheticPipeline"
    with pytest.raises(TypeError, match="a synthetic pipeline takes SyntheticOptions, not dict"):
        pipelines.create("synthetic", {"reply": "hi"})  # type: ignore[arg-type]


def test_a_config_built_from_data_is_typed_too():
    cfg = config_file.from_dict({"pipeline": {"kind": "synthetic", "options": {"reply": "hi", "chunk_ms": 20}}})
    assert cfg.pipeline.options == SyntheticOptions(reply="hi", chunk_ms=20)
    # decoded without from_dict, the options would be an empty Struct: refused, not passed on
    with pytest.raises(msgspec.ValidationError, match="SyntheticOptions"):
        msgspec.convert({"pipeline": {"kind": "synthetic", "options": {}}}, config_file.ServerConfig)


def _cpu(**changes: Any) -> dict[str, Any]:
    return config_file.merged(config_file.raw("cpu"), changes)


@pytest.mark.parametrize(
    "data, key, problem",
    [
        (_cpu(pipeline={"options": {"thinker": {"max_tokenz": 64}}}), "pipeline.options.thinker.max_tokenz", "unknown field"),
        (_cpu(pipeline={"options": {"asr_threads": "two"}}), "pipeline.options.asr_threads", "expected int, got str"),
        (_cpu(pipeline={"options": {"asr_window": "half"}}), "pipeline.options.asr_window", "invalid enum value 'half'"),
        (_cpu(pipeline={"kind": "cascad"}), "pipeline.kind", "unknown pipeline kind 'cascad'; known: cascade, omni, synthetic"),
        (_cpu(pipeline={"optionz": {}}), "pipeline.optionz", "unknown field"),
        (_cpu(pipeline="cascade"), "pipeline", "expected object, got str"),
        ({"port": 8000}, "pipeline", "required, not given"),
        (_cpu(limits={"max_items": "many"}), "limits.max_items", "expected int, got str"),
        (_cpu(sip={"portt": 5060}), "sip.portt", "unknown field"),
        (_cpu(session={"tools": [{"type": "function", "nam": "x"}]}), "session.tools[0].nam", "unknown field"),
        (_cpu(ssl_certfile="cert.pem"), "", "ssl_certfile and ssl_keyfile go together: give both, or neither"),
        # a key that moved says where to (config.MOVED)
        (_cpu(pipeline={"options": {"thinker": {"steer_calls": False}}}), "pipeline.options.thinker.steer_calls", "unknown field (moved to pipeline.options.thinker.calls.steer)"),
        (_cpu(pipeline={"options": {"thinker": {"tool_max_tokens": 99}}}), "pipeline.options.thinker.tool_max_tokens", "unknown field (moved to pipeline.options.thinker.calls.max_tokens)"),
    ],
)
def test_every_problem_is_one_error_naming_the_file_and_the_key(data: dict[str, Any], key: str, problem: str):
    with pytest.raises(ConfigError) as caught:
        config_file.from_dict(data, "configs/bad.yaml")
    assert (caught.value.key, caught.value.problem) == (key, problem)
    assert str(caught.value) == f"invalid config configs/bad.yaml: {key + ': ' if key else ''}{problem}"
    assert isinstance(caught.value, ValueError)


def _serve(tmp_path: Path, text: str, *flags: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "host", "serve", "--config", str(path), *flags], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    "text, flags, message",
    [
        (yaml.safe_dump(_cpu(pipeline={"options": {"thinker": {"max_tokenz": 64}}})), (), "pipeline.options.thinker.max_tokenz: unknown field"),
        ("pipeline: {kind: synthetic, options: {chunk_ms: fast}}\n", (), "pipeline.options.chunk_ms: expected int, got str"),
        ("pipeline: {kind: syntetic}\n", (), "pipeline.kind: unknown pipeline kind 'syntetic'; known: cascade, omni, synthetic"),
        ("pipeline: {kind: synthetic\nport: 1\n", (), "not YAML: expected ',' or '}', but got ':' (line 2, column 5)"),
        ("- pipeline\n", (), "expected a mapping of settings, got list"),
        ("pipeline: {kind: synthetic}\n", ("--engine-url", "http://127.0.0.1:9/v1"), "engine_url: a synthetic pipeline has no engine to point at a URL"),
        ("pipeline: {kind: synthetic}\n", ("--ssl-certfile", "cert.pem"), "ssl_certfile and ssl_keyfile go together: give both, or neither"),
    ],
)
def test_serve_says_what_is_wrong_in_one_line_and_exits_2(tmp_path: Path, text: str, flags: tuple[str, ...], message: str):
    run = _serve(tmp_path, text, "--port", "0", *flags)
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines() == [f"invalid config {tmp_path / 'bad.yaml'}: {message}"]
    assert "Traceback" not in run.stderr + run.stdout


def test_serve_names_a_missing_config_in_one_line(tmp_path: Path):
    run = subprocess.run([sys.executable, "-m", "host", "serve", "--config", str(tmp_path / "gone.yaml")], capture_output=True, text=True, timeout=120, check=False)
    assert (run.returncode, run.stderr.splitlines()) == (2, [f"invalid config {tmp_path / 'gone.yaml'}: file not found"])


def test_flags_make_a_new_config_and_change_nothing_else():
    args = cli.parser().parse_args(
        ["serve", "--config", "cpu", "--host", "0.0.0.0", "--port", "9001", "--sip-port", "5070", "--api-key", "k", "--state-url", "redis://r:6379/0"]
    )
    raw = config_file.raw("cpu")
    before = config_file.load("cpu")
    cfg = cli.config_from(args)
    assert (cfg.host, cfg.port, cfg.api_key, cfg.state_url, cfg.sip.port) == ("0.0.0.0", 9001, "k", "redis://r:6379/0", 5070)
    # the rest as the file says: the SIP section keeps its other settings, the pipeline its options
    assert msgspec.structs.replace(cfg.sip, port=before.sip.port) == before.sip
    assert cfg.pipeline == before.pipeline and cfg.limits == before.limits and cfg.session == before.session
    assert config_file.load("cpu") == before  # nothing shared was changed
    assert config_file.merged(raw, {"sip": {"port": 1}, "port": None}) == {**raw, "sip": {**raw.get("sip", {}), "port": 1}}
    assert raw == config_file.raw("cpu")  # merged copies, never writes into its arguments


def test_no_flags_is_the_file_as_it_is():
    assert cli.config_from(cli.parser().parse_args(["serve", "--config", "synthetic"])) == config_file.load("synthetic")


def test_engine_url_puts_the_cascade_thinker_on_a_remote_engine():
    url = "http://gpu-host:8091/v1"
    before = config_file.load("cpu")
    cfg = cli.config_from(cli.parser().parse_args(["serve", "--engine-url", url]))  # the default config: cpu
    assert cfg.pipeline.kind == "cascade" and isinstance(cfg.pipeline.options, CascadeOptions)
    thinker = cfg.pipeline.options.thinker
    assert (thinker.engine, thinker.remote.url) == ("remote", url)
    assert isinstance(before.pipeline.options, CascadeOptions)
    # the model, its budget and the remote's other settings as configured; only where it runs changed
    assert msgspec.structs.replace(thinker, engine=before.pipeline.options.thinker.engine, remote=before.pipeline.options.thinker.remote) == before.pipeline.options.thinker
    assert msgspec.structs.replace(thinker.remote, url=before.pipeline.options.thinker.remote.url) == before.pipeline.options.thinker.remote
    assert msgspec.structs.replace(cfg.pipeline.options, thinker=before.pipeline.options.thinker) == before.pipeline.options


@pytest.mark.parametrize("name", ["qwen3-omni", "qwen3-omni-local"])
def test_engine_url_puts_an_omni_model_on_a_remote_engine(name: str):
    cfg = cli.config_from(cli.parser().parse_args(["serve", "--config", name, "--engine-url", "http://router:8000/v1"]))
    assert isinstance(cfg.pipeline.options, OmniOptions)
    assert (cfg.pipeline.options.engine, cfg.pipeline.options.remote.url) == ("remote", "http://router:8000/v1")


def test_the_session_defaults_example_of_the_docs_loads_as_it_says():
    """docs/configuration.md's example of `session` and `sip.session`, loaded as written."""
    page = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    section = page.split("## Session defaults", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    cfg = config_file.from_dict({"pipeline": {"kind": "synthetic"}, **yaml.safe_load(block)})
    assert type(cfg.session.audio.input.turn_detection).__name__ == "SemanticVad"  # type: ignore[union-attr]
    assert cfg.session.audio.input.turn_detection.eagerness == "low"  # type: ignore[union-attr]
    assert [t.name for t in cfg.session.tools] == ["get_weather"]  # type: ignore[union-attr]
    (mcp_tool,) = cfg.sip.session.tools  # type: ignore[misc]
    assert (type(mcp_tool).__name__, mcp_tool.require_approval) == ("McpTool", "never")
    assert cfg.mcp.allowed_servers == [mcp_tool.server_url]
