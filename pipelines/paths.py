"""Where the project keeps what it makes on this machine: prepared models.

``REALTIME_OMNI_HOME``, else ``~/.cache/realtime-omni``.
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("REALTIME_OMNI_HOME") or Path.home() / ".cache" / "realtime-omni")
