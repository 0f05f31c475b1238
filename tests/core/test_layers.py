"""The package order of docs/architecture.md, read from the code's own imports (those inside
functions too): host > transports > realtime_omni > pipelines > dsp, imports point down only; the
product imports neither the benches nor the tests, and the session core knows no web server."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
PRODUCT = ["host", "transports", "realtime_omni", "pipelines", "dsp"]  # top first
CLIENTS = {"bench", "tests"}  # they import the product; it never imports them
WEB_SERVER = {"starlette", "uvicorn", "h11", "httptools", "websockets"}  # host's and the transports' business


def imports(package: str) -> list[tuple[str, str]]:
    """(module path, top-level name) of every absolute import in ``package``."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(str(path.relative_to(ROOT)), alias.name.split(".")[0]) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.append((str(path.relative_to(ROOT)), node.module.split(".")[0]))
    return found


def test_imports_point_down_only():
    upward = []
    for rank, package in enumerate(PRODUCT):
        above = set(PRODUCT[:rank]) | CLIENTS
        upward += [(where, name) for where, name in imports(package) if name in above]
    assert upward == []


def test_the_session_core_knows_no_web_server():
    assert [(where, name) for where, name in imports("realtime_omni") if name in WEB_SERVER] == []


def test_the_wheel_ships_the_product_and_no_bench():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert sorted(config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]) == sorted(PRODUCT)
