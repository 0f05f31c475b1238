"""Two replay summaries side by side, with B/A ratios (``bench/report.py`` writes the summaries).

    python -m bench compare A/summary.json B/summary.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .report import compare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="the first summary.json (A)")
    parser.add_argument("b", type=Path, help="the second summary.json (B)")
    args = parser.parse_args(argv)
    print(compare(args.a, args.b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
