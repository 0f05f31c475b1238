"""The int8 thinker weights: the AVX2 kernel against float64 arithmetic, the packed layout, the slow
path, the checks at the kernel's boundary, its build at install (hatch_build.py, for a wheel and an
editable install), the checkpoint writer, and vLLM running the int8 checkpoint as faithfully as fp32."""

from __future__ import annotations

import importlib.util
import itertools
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.int8 import kernel as w8

ROOT = Path(__file__).resolve().parents[2]
SHAPES = [(m, k, n) for m, k, n in itertools.product([1, 2, 3, 4, 7, 25], [8, 9, 64, 900], [1, 3, 4, 5, 13, 64])]


def _reference(x, q, scale, bias):
    w = q.double() * scale.double()[:, None]
    return torch.nn.functional.linear(x.double(), w, None if bias is None else bias.double())


def _close(y, x, q, scale, ref) -> bool:
    """``y`` within what the kernel promises of the exact ``ref``: float rounding for one row; for
    several, each row's activations rounded to int16 (a step of max|x| / 32767) as well, so an
    output may be off by half a step times the channel's sum of |weights| (the bound, not a guess)."""
    float_err = 1e-5 * ref.abs() + 1e-4 * float(ref.abs().max())
    if x.reshape(-1, x.shape[-1]).shape[0] <= 1:
        return bool(((y.double() - ref).abs() <= float_err).all())
    x2 = x.reshape(-1, x.shape[-1]).double()
    step = x2.abs().amax(dim=1, keepdim=True) / 32767  # [M, 1]
    weights = (q.double().abs() * scale.double()[:, None]).sum(dim=1)  # [N]
    bound = (0.5 * step * weights[None, :]).reshape(ref.shape)
    return bool(((y.double() - ref).abs() <= bound + float_err).all())


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_the_kernel_computes_the_product(m, k, n):
    assert w8.kernel_problem() is None, "the kernel must build and run on the machines this project runs on"
    g = torch.Generator().manual_seed(m * 10_000 + k * 100 + n)
    q, scale = w8.quantize(torch.randn(n, k, generator=g))
    x = torch.randn(m, k, generator=g)
    for bias in (None, torch.randn(n, generator=g)):
        y = w8.linear(x, w8.pack(q), scale, bias)
        ref = _reference(x, q, scale, bias)
        assert y.shape == (m, n) and y.dtype == torch.float32
        assert _close(y, x, q, scale, ref)


@pytest.mark.parametrize("k", [4096, 4104, 8200])
def test_several_rows_at_their_largest_sum_without_overflow(k):
    """The prefill path sums int16 x int8 products in int32 lanes: at the largest values both can
    hold (every activation the row's max, every weight 127), over more inputs than one int32 sum
    may take, the result is still exact to float rounding (and a sign flip is too)."""
    q = torch.full((5, k), 127, dtype=torch.int8)
    q[1] = -127
    scale = torch.full((5,), 0.01)
    x = torch.ones(3, k) * torch.tensor([[1.0], [-2.0], [1e6]])
    y = w8.linear(x, w8.pack(q), scale)
    ref = _reference(x, q, scale, None)
    assert torch.allclose(y.double(), ref, rtol=1e-6)


def test_a_row_with_an_outlier_stays_within_the_bound():
    """LLM activations carry a few channels hundreds of times larger than the rest: the rest then
    get a coarser int16 step, and the product stays within the stated bound."""
    g = torch.Generator().manual_seed(11)
    q, scale = w8.quantize(torch.randn(64, 896, generator=g))
    x = torch.randn(7, 896, generator=g)
    x[:, 5] = 300.0
    y = w8.linear(x, w8.pack(q), scale)
    ref = _reference(x, q, scale, None)
    assert _close(y, x, q, scale, ref)
    assert float((y.double() - ref).abs().max()) < 1e-3 * float(ref.abs().max())


def test_the_kernel_takes_any_leading_shape_and_dtype():
    q, scale = w8.quantize(torch.randn(24, 32))
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    y = w8.linear(x, w8.pack(q), scale)
    assert y.shape == (2, 5, 24) and y.dtype == torch.bfloat16
    ref = _reference(x.reshape(10, 32).float(), q, scale, None).reshape(2, 5, 24)
    assert torch.allclose(y.double(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))
    assert w8.linear(torch.randn(0, 32), w8.pack(q), scale).shape == (0, 24)


def test_packing_round_trips_and_keeps_each_block_contiguous():
    q = torch.arange(5 * 12, dtype=torch.int32).remainder(251).sub(125).to(torch.int8).reshape(5, 12)
    packed = w8.pack(q)
    assert packed.shape == (2, 4 * 16)  # 5 channels -> 2 blocks of 4; 12 inputs -> 16
    assert torch.equal(w8.unpack(packed, 5, 12), q)
    # block 0, inputs 0..7: channel 0's 8 weights, then channel 1's, 2's, 3's
    assert torch.equal(packed[0, :32].view(4, 8), q[:4, :8])


def test_the_slow_path_gives_the_same_product(monkeypatch):
    q, scale = w8.quantize(torch.randn(13, 40))
    x, bias = torch.randn(3, 40), torch.randn(13)
    fast = w8.linear(x, w8.pack(q), scale, bias)
    monkeypatch.setattr(w8, "_load", lambda: None)
    slow = w8.linear(x, w8.pack(q), scale, bias)
    assert _close(slow, x, q, scale, _reference(x, q, scale, bias))  # the slow path: float throughout
    assert _close(fast, x, q, scale, slow.double())


def _never_the_kernel():
    pytest.fail("a bad input reached the kernel")


def _bad_inputs():
    q, scale = w8.quantize(torch.randn(13, 40))
    packed, x = w8.pack(q), torch.randn(3, 40)
    wide = torch.zeros(packed.shape[0], 2 * packed.shape[1], dtype=torch.int8)
    wide[:, : packed.shape[1]] = packed
    return [
        ("x of ints", TypeError, "x must be a floating", (x.to(torch.int32), packed, scale)),
        ("x a list", TypeError, "x must be a floating", (x.tolist(), packed, scale)),
        ("x off the CPU", ValueError, "x must be on the CPU", (x.to("meta"), packed, scale)),
        ("x with more inputs", ValueError, "x has 48 inputs", (torch.randn(3, 48), packed, scale)),
        ("x with fewer inputs", ValueError, "x has 32 inputs", (torch.randn(3, 32), packed, scale)),
        ("a 0-d x", ValueError, "x has -1 inputs", (torch.tensor(1.0), packed, scale)),
        ("weights not packed (float)", TypeError, "packed must be torch.int8", (x, packed.float(), scale)),
        ("weights unpacked [N, K]", ValueError, "4 channels x K8 inputs", (x, q, scale)),
        ("weights not contiguous", ValueError, "packed must be contiguous", (x, wide[:, : packed.shape[1]], scale)),
        ("weights 1-d", ValueError, "packed must have 2 dimensions", (x, packed.reshape(-1), scale)),
        ("scale float64", TypeError, "scale must be torch.float32", (x, packed, scale.double())),
        ("scale [N, 1] (as loaded)", ValueError, "scale must have 1 dimensions", (x, packed, scale[:, None])),
        ("scale for other channels", ValueError, "scale has 17 channels", (x, packed, torch.ones(17))),
        ("bias of ints", TypeError, "bias must be a floating", (x, packed, scale, torch.ones(13, dtype=torch.int64))),
        ("bias of another length", ValueError, "bias must be a CPU tensor of shape (13,)", (x, packed, scale, torch.ones(12))),
    ]


@pytest.mark.parametrize("case", range(len(_bad_inputs())), ids=[c[0] for c in _bad_inputs()])
def test_linear_refuses_bad_inputs_before_the_kernel(case, monkeypatch):
    _, error, message, args = _bad_inputs()[case]
    monkeypatch.setattr(w8, "_load", _never_the_kernel)
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        w8.linear(*args)


def test_pack_unpack_and_quantize_refuse_bad_inputs():
    q, _ = w8.quantize(torch.randn(5, 12))
    with pytest.raises(TypeError, match="torch.int8"):
        w8.pack(q.float())
    with pytest.raises(ValueError, match="2 dimensions"):
        w8.pack(q.reshape(-1))
    with pytest.raises(ValueError, match="does not fit"):
        w8.unpack(w8.pack(q), 9, 12)  # 2 blocks hold 8 channels
    with pytest.raises(ValueError, match="does not fit"):
        w8.unpack(w8.pack(q), 5, 17)  # 12 inputs pad to 16
    with pytest.raises(TypeError, match="floating point"):
        w8.quantize(q)
    with pytest.raises(ValueError, match=r"\[N, K\]"):
        w8.quantize(torch.randn(2, 3, 4))


def test_non_contiguous_activations_scales_and_weights_to_pack_are_made_contiguous():
    g = torch.Generator().manual_seed(7)
    q, scale = w8.quantize(torch.randn(13, 40, generator=g))
    x = torch.randn(40, 3, generator=g).t()  # [3, 40], not contiguous
    spread = torch.stack([scale, scale], dim=1)[:, 0]  # every other float of a [13, 2]
    bias = torch.randn(13, 2, generator=g)[:, 1]
    q_t = q.t().contiguous().t()  # [13, 40] in column order
    assert not any(t.is_contiguous() for t in (x, spread, bias, q_t))
    ref = _reference(x, q, scale, bias)
    got = w8.linear(x, w8.pack(q_t), spread, bias)
    assert _close(got, x, q, scale, ref)


def _hatch_build():
    spec = importlib.util.spec_from_file_location("hatch_build", ROOT / "hatch_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hook(hb, root: Path, directory: Path):
    return hb.KernelBuildHook(str(root), {}, None, None, str(directory), "wheel")


def _use_library(monkeypatch, library: Path) -> None:
    """The kernel loaded afresh from ``library``."""
    monkeypatch.setattr(w8, "LIBRARY", library)
    monkeypatch.setattr(w8, "_kernel", None)
    monkeypatch.setattr(w8, "_problem", None)


def _agrees_with_the_reference() -> bool:
    g = torch.Generator().manual_seed(3)
    q, scale = w8.quantize(torch.randn(13, 40, generator=g))
    x, bias = torch.randn(5, 40, generator=g), torch.randn(13, generator=g)
    ref = _reference(x, q, scale, bias)
    return _close(w8.linear(x, w8.pack(q), scale, bias), x, q, scale, ref)


def test_the_wheel_carries_the_kernel_built_at_install_and_it_loads(tmp_path, monkeypatch):
    from hatchling.builders.wheel import WheelBuilder

    wheel = Path(next(WheelBuilder(str(ROOT)).build(directory=str(tmp_path), versions=["standard"])))
    assert wheel.name.endswith("linux_x86_64.whl"), wheel.name  # a compiled library: not py3-none-any
    with zipfile.ZipFile(wheel) as zf:
        assert "Root-Is-Purelib: false" in zf.read("realtime_omni-0.1.0.dist-info/WHEEL").decode()
        zf.extract("pipelines/int8/_w8_linear.so", tmp_path / "unzipped")
    _use_library(monkeypatch, tmp_path / "unzipped/pipelines/int8/_w8_linear.so")
    assert w8.kernel_problem() is None
    assert w8._kernel is not None and _agrees_with_the_reference()


def test_an_editable_install_builds_the_kernel_beside_its_source(tmp_path):
    hb = _hatch_build()
    root = tmp_path / "checkout"
    (root / "pipelines/int8").mkdir(parents=True)
    shutil.copy(ROOT / hb.SOURCE, root / hb.SOURCE)
    build_data = {"force_include": {}, "pure_python": True, "infer_tag": False}
    _hook(hb, root, tmp_path / "dist").initialize("editable", build_data)
    assert (root / hb.LIBRARY).is_file()  # where the editable install imports pipelines from
    assert build_data == {"force_include": {}, "pure_python": True, "infer_tag": False}


def test_without_a_compiler_the_install_goes_on_and_the_slow_path_says_how_to_get_the_kernel(tmp_path, monkeypatch):
    hb = _hatch_build()
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "no C compiler" in hb.compile_kernel(ROOT / hb.SOURCE, tmp_path / "lib.so")
    build_data = {"force_include": {}, "pure_python": True, "infer_tag": False}
    _hook(hb, ROOT, tmp_path / "dist").initialize("standard", build_data)
    assert build_data == {"force_include": {}, "pure_python": True, "infer_tag": False}  # a pure wheel, no library
    monkeypatch.undo()

    _use_library(monkeypatch, tmp_path / "never-built.so")
    problem = w8.kernel_problem()
    assert problem and "not built" in problem and "C compiler" in problem and "reinstall" in problem
    assert w8._kernel is None and _agrees_with_the_reference()  # torch's path, the same product


def test_a_library_built_from_another_source_is_refused(tmp_path, monkeypatch):
    hb = _hatch_build()
    other = tmp_path / "w8_linear.c"
    other.write_text((ROOT / hb.SOURCE).read_text() + "\n/* another version */\n")
    assert hb.compile_kernel(other, tmp_path / "old.so") is None
    _use_library(monkeypatch, tmp_path / "old.so")
    problem = w8.kernel_problem()
    assert problem and "another version of w8_linear.c" in problem
    assert w8._kernel is None and _agrees_with_the_reference()


def test_quantize_is_per_channel_symmetric_and_bounded():
    w = torch.tensor([[1.0, -0.5, 0.25], [0.0, 0.0, 0.0], [-3.0, 3.0, 1.5]])
    q, scale = w8.quantize(w)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert torch.equal(q[0], torch.tensor([127, -64, 32], dtype=torch.int8))  # -63.5 rounds to even
    assert torch.equal(q[1], torch.zeros(3, dtype=torch.int8))
    assert torch.allclose(q.float() * scale[:, None], w, atol=float(scale.max()) / 2 + 1e-7)


def test_the_checkpoint_writer_quantizes_the_linear_layers_and_the_head_only(tmp_path):
    from safetensors.torch import load_file, save_file

    from pipelines.int8.quantize import quantize_checkpoint
    from pipelines.int8.vllm_method import NAME

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir(), out.mkdir()
    tensors = {
        "model.embed_tokens.weight": torch.randn(50, 16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(16),
        "model.layers.0.mlp.down_proj.weight": torch.randn(16, 32),
        "model.layers.0.input_layernorm.weight": torch.randn(16),
        "lm_head.weight": torch.randn(50, 16),
    }
    save_file(tensors, src / "model.safetensors")
    (src / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    (src / "tokenizer.json").write_text("{}")
    quantize_checkpoint(src, out)
    got = load_file(out / "model.safetensors")
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight", "lm_head.weight"):
        assert got[name].dtype == torch.int8
        assert got[name + "_scale"].shape == (tensors[name].shape[0], 1)
        assert torch.allclose(got[name].float() * got[name + "_scale"], tensors[name], atol=float(got[name + "_scale"].max()) / 2 + 1e-6)
    for name in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.bias", "model.layers.0.input_layernorm.weight"):
        assert torch.equal(got[name], tensors[name])
    assert json.loads((out / "config.json").read_text())["quantization_config"] == {"quant_method": NAME}
    assert (out / "tokenizer.json").exists()


def test_the_vllm_plugin_entry_point_imports_without_vllm():
    import subprocess
    import sys

    code = "import sys, pipelines.int8.vllm_method as m; assert m.NAME and 'vllm' not in sys.modules, 'vllm imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]


def test_register_is_idempotent_and_the_config_gives_each_layer_its_method():
    from vllm.model_executor.layers.linear import WEIGHT_LOADER_V2_SUPPORTED, ReplicatedLinear
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    from pipelines.int8 import vllm_method, vllm_quant

    vllm_method.register()
    vllm_method.register()
    assert get_quantization_config(vllm_method.NAME) is vllm_quant.RealtimeOmniW8Config
    assert WEIGHT_LOADER_V2_SUPPORTED.count("RealtimeOmniW8LinearMethod") == 1
    config = vllm_quant.RealtimeOmniW8Config.from_config({"quant_method": vllm_method.NAME})
    assert config.get_name() == vllm_method.NAME
    # the layers' classes as vLLM builds them; isinstance is all the config asks of them
    assert type(config.get_quant_method(ParallelLMHead.__new__(ParallelLMHead), "lm_head")) is vllm_quant.RealtimeOmniW8HeadMethod
    assert type(config.get_quant_method(ReplicatedLinear.__new__(ReplicatedLinear), "q_proj")) is vllm_quant.RealtimeOmniW8LinearMethod
    assert config.get_quant_method(torch.nn.Embedding(3, 4), "embed_tokens") is None


def test_the_head_method_loads_packs_and_applies_the_int8_product():
    from pipelines.int8 import vllm_quant

    g = torch.Generator().manual_seed(5)
    q, scale = w8.quantize(torch.randn(13, 40, generator=g))
    layer, method = torch.nn.Module(), vllm_quant.RealtimeOmniW8HeadMethod()
    method.create_weights(layer, 40, [13], 40, 13, torch.float32, weight_loader=lambda param, loaded: param.data.copy_(loaded))
    layer.weight.weight_loader(layer.weight, q)
    layer.weight_scale.weight_loader(layer.weight_scale, scale[:, None])
    method.process_weights_after_loading(layer)
    assert torch.equal(layer.weight, w8.pack(q)) and layer.weight_scale.shape == (13,)
    x = torch.randn(3, 40, generator=g)
    ref = _reference(x, q, scale, None)
    assert _close(method.apply(layer, x), x, q, scale, ref)


TEXT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of "
    "France, and what is it famous for?<|im_end|>\n<|im_start|>assistant\nThe capital of France is Paris. It is "
    "famous for the Eiffel Tower, the Louvre museum, its cafes and its long history of art and fashion.<|im_end|>"
)


async def _prompt_logprobs(model: str) -> tuple[list[int], list[dict[int, float]]]:
    """The thinker engine as the server starts it, reading TEXT: each position's top-5 next tokens."""
    from vllm import SamplingParams
    from vllm.inputs import tokens_input

    from pipelines.cascade.thinker import ThinkerOptions, Thinker

    thinker = Thinker(ThinkerOptions(model=model, max_num_seqs=1))
    await thinker.start(lambda _m: None)
    try:
        ids = thinker.tokenizer.encode(TEXT, add_special_tokens=False)
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=5)
        final = None
        async for out in thinker.engine.llm.generate(tokens_input(ids, cache_salt="w8-test"), params, request_id=f"w8-{model}"):  # type: ignore[attr-defined]
            final = out
        return ids, [{t: lp.logprob for t, lp in (p or {}).items()} for p in final.prompt_logprobs]
    finally:
        await thinker.stop()


@pytest.mark.engine
@pytest.mark.timeout(900)
async def test_vllm_runs_the_int8_thinker_as_faithfully_as_fp32():
    """Teacher-forced over a chat exchange, the int8 thinker's most likely next token is the fp32
    thinker's at almost every position, and it gives the text's own tokens about the same log
    probability (what a per-channel int8 rounding should cost, and no more)."""
    ids, fp32 = await _prompt_logprobs("qwen2.5-coder-0.5b-instruct")
    _, int8 = await _prompt_logprobs("qwen2.5-coder-0.5b-instruct-w8")
    positions = range(1, len(ids))
    top = [max(fp32[i], key=fp32[i].get) == max(int8[i], key=int8[i].get) for i in positions]
    assert np.mean(top) >= 0.9, f"top-1 agreement {np.mean(top):.2f}"
    drift = [abs(fp32[i][ids[i]] - int8[i][ids[i]]) for i in positions if ids[i] in fp32[i] and ids[i] in int8[i]]
    assert len(drift) >= len(ids) // 2 and np.median(drift) < 0.1, f"median |d logprob| {np.median(drift):.3f} over {len(drift)}"


@pytest.mark.parametrize("m", [1, 4])
def test_a_row_that_is_not_finite_gives_nan_in_that_row_only(m):
    """A NaN or an infinity in a row (a model gone wrong) shows in its outputs, as a float product
    would show it, rather than being rounded into a number; the other rows are untouched."""
    g = torch.Generator().manual_seed(13)
    q, scale = w8.quantize(torch.randn(9, 64, generator=g))
    x = torch.randn(m, 64, generator=g)
    for bad in (float("nan"), float("inf")):
        xb = x.clone()
        xb[m - 1, 3] = bad
        y = w8.linear(xb, w8.pack(q), scale)
        assert not torch.isfinite(y[m - 1]).any()
        if m > 1:
            assert _close(y[: m - 1], x[: m - 1], q, scale, _reference(x[: m - 1], q, scale, None))
