"""``python -m bench <name> [args]``: runs the bench ``bench/<name>.py`` exactly as
``python -m bench.<name> [args]`` does; ``python -m bench`` alone lists the benches.

The benches are clients of the product, run from a checkout of the repository: the wheel does not
ship them and the ``realtime-omni`` command does not know them.
"""

from __future__ import annotations

import ast
import re
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).parent


def benches() -> dict[str, str]:
    """Every runnable module of this package (one with a ``__main__`` block), and the first
    sentence of its docstring. Read from the source, not imported: a bench may need what another lacks."""
    found = {}
    for path in sorted(HERE.glob("*.py")):
        source = path.read_text()
        if path.stem.startswith("_") or 'if __name__ == "__main__":' not in source:
            continue
        doc = ast.get_docstring(ast.parse(source)) or ""
        found[path.stem] = re.split(r"(?<=[.?!])\s", " ".join(doc.split()), maxsplit=1)[0]
    return found


def usage() -> str:
    lines = ["usage: python -m bench <name> [args]   (python -m bench <name> --help for its flags)", "", "benches:"]
    lines += [f"  {name:16} {summary}" for name, summary in benches().items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in benches():
        print(f"python -m bench: no bench named {name!r} (python -m bench lists them)", file=sys.stderr)
        return 2
    sys.argv = [name, *rest]  # argv[0] becomes the module's path, as under python -m bench.<name>
    runpy.run_module(f"bench.{name}", run_name="__main__", alter_sys=True)  # its own sys.exit ends the run
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
