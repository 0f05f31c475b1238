"""Builds the int8 thinker's matmul kernel when the project is installed (a hatchling build hook).

``pipelines/int8/w8_linear.c`` is compiled with the machine's C compiler into
``pipelines/int8/_w8_linear.so``, which ``pipelines/int8/kernel.py`` loads at run time (no compiler
is called then):

- ``pip install .`` (a wheel): built in a scratch folder and put into the wheel, which is then
  tagged for this platform;
- ``pip install -e .`` (editable): built beside the source, where the editable install imports
  ``pipelines`` from.

The flags ask for x86-64 with AVX2 and FMA and nothing newer, so the library runs on any AVX2 machine
(the loader checks the CPU before calling it). Where no library can be built (no C compiler, not
x86-64, the compiler failed) the install goes on without it: the int8 weights then run on torch's
slow path, and ``kernel_problem()`` says why. ``python3 hatch_build.py`` builds it beside the
source of a checkout without installing anything.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = "pipelines/int8/w8_linear.c"
LIBRARY = "pipelines/int8/_w8_linear.so"
FLAGS = ["-O3", "-march=x86-64", "-mtune=generic", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c11"]


def source_tag(source: bytes) -> str:
    """The tag a library carries of the source it was built from (``kernel.py`` computes the same)."""
    return hashlib.sha256(source).hexdigest()[:16]


def compile_kernel(source: Path, out: Path) -> str | None:
    """Compile ``source`` into the shared library ``out``: None when built, else why not."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the kernel is x86-64 code (AVX2 + FMA); this is {platform.machine()}"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return "no C compiler (cc or gcc) was found"
    tag = source_tag(source.read_bytes())
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        part = Path(tmp) / out.name
        command = [*shlex.split(cc), *FLAGS, f'-DW8_LINEAR_TAG="{tag}"', str(source), "-o", str(part)]
        try:
            done = subprocess.run(command, capture_output=True, text=True)
        except OSError as exc:
            return f"the C compiler {cc} did not run: {exc}"
        if done.returncode:
            return f"{cc} failed: {done.stderr.strip()[-2000:]}"
        os.replace(part, out)  # atomic: a loader never sees half a library
    return None


class KernelBuildHook(BuildHookInterface):
    """Compiles the kernel for the wheel target, standard or editable."""

    PLUGIN_NAME = "custom"
    _scratch: str | None = None  # the standard wheel's library is built here

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        if version == "editable":
            out = root / LIBRARY
        else:
            self._scratch = tempfile.mkdtemp(prefix="w8-linear-")
            out = Path(self._scratch) / Path(LIBRARY).name
        problem = compile_kernel(root / SOURCE, out)
        if problem:
            self.finalize(version, build_data, "")
            self.app.display_warning(
                f"realtime-omni: the int8 kernel was not built ({problem}); the int8 thinker will run on "
                "torch's slow path. Install a C compiler (gcc) and reinstall to get it."
            )
            return
        if version != "editable":
            build_data["force_include"][str(out)] = LIBRARY
            build_data["pure_python"] = False  # a compiled library: the wheel is for this platform
            build_data["infer_tag"] = True

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        scratch, self._scratch = getattr(self, "_scratch", None), None
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    here = Path(__file__).parent
    why = compile_kernel(here / SOURCE, here / LIBRARY)
    print(why or f"built {LIBRARY}", file=sys.stderr if why else sys.stdout)
    sys.exit(1 if why else 0)
