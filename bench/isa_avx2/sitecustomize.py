"""Put on PYTHONPATH by ``bench.isa`` (``--isa avx2``): this process and its children behave as on a
CPU with AVX2 and no AVX-512, where the libraries let that be chosen. torch reports AVX-512 from
the CPU itself, and vLLM picks its kernel library by that report, so the report is patched once
torch is imported; ATen, oneDNN, MKL and CTranslate2 are steered by the environment ``bench.isa``
sets. onnxruntime (Piper, Smart Turn) has no such switch and keeps its AVX-512 kernels."""

import importlib.abc
import sys


class _PatchTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # noqa: ANN001, ANN201
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):  # noqa: ANN001, ANN201
                return loader.create_module(spec)

            def exec_module(self, module):  # noqa: ANN001, ANN201
                loader.exec_module(module)
                no = staticmethod(lambda: False)
                for fn in ("_is_avx512_supported", "_is_avx512_vnni_supported", "_is_avx512_bf16_supported", "_is_amx_tile_supported", "_is_amx_fp16_supported"):
                    if hasattr(module.cpu, fn):
                        setattr(module.cpu, fn, no)

        spec.loader = Loader()
        return spec


sys.meta_path.insert(0, _PatchTorch())
