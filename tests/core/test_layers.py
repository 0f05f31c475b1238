"""The package order of docs/architecture.md, read from the code's own imports (those inside
functions too): host > transports > realtime_omni > pipelines > dsp, imports point down only; the
product imports neither the benches nor the tests, and the session core knows no web server and
reaches nothing outside the process itself (its ports' adapters do, in host/)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
PRODUCT = ["host", "transports", "realtime_omni", "pipelines", "dsp"]  # top first
CLIENTS = {"bench", "tests"}  # they import the product; it never imports them
WEB_SERVER = {"starlette", "uvicorn", "h11", "httptools", "websockets"}  # host's and the transports' business
# the clients of what lies outside (MCP servers and their HTTP, an OTLP collector, Redis): the core has
# a port for each (session/tool_servers.py, tracing.py, store.py), host/ the adapter
OUTSIDE = ["mcp", "httpx", "opentelemetry.sdk", "opentelemetry.exporter", "redis"]


def imports(package: str, *, whole: bool = False) -> list[tuple[str, str]]:
    """(module path, top-level name) of every absolute import in ``package``; ``whole``: the
    module's whole dotted name instead."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found += [(str(path.relative_to(ROOT)), name if whole else name.split(".")[0]) for name in names]
    return found


def outside(package: str) -> list[tuple[str, str]]:
    """The imports in ``package`` of a client of something outside (``OUTSIDE``)."""
    return [(where, name) for where, name in imports(package, whole=True) if any(name == o or name.startswith(o + ".") for o in OUTSIDE)]


def test_imports_point_down_only():
    upward = []
    for rank, package in enumerate(PRODUCT):
        above = set(PRODUCT[:rank]) | CLIENTS
        upward += [(where, name) for where, name in imports(package) if name in above]
    assert upward == []


def test_the_session_core_knows_no_web_server():
    assert [(where, name) for where, name in imports("realtime_omni") if name in WEB_SERVER] == []


def test_the_session_core_reaches_nothing_outside_the_process():
    assert outside("realtime_omni") == []
    # the adapters hold them, imported where they are first needed (inside functions) and seen there
    seen = {(where, name.split(".")[0]) for where, name in outside("host")}
    assert {("host/mcp_client.py", "mcp"), ("host/otel_tracing.py", "opentelemetry"), ("host/redis_store.py", "redis")} <= seen


def test_the_wheel_ships_the_product_and_no_bench():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert sorted(config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]) == sorted(PRODUCT)


def module_graph(packages: list[str] = PRODUCT) -> dict[str, set[str]]:
    """Every module of ``packages`` and the modules of theirs it imports (anywhere in it: functions
    and ``TYPE_CHECKING`` blocks too), relative imports resolved."""
    modules = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            modules[name] = (path, is_package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        here = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) if node.level else node.module or ""
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                while target and target not in modules:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):  # (a package's own __init__ is no edge)
                    graph[name].add(target)
    return graph


def test_no_two_modules_import_each_other_even_through_others():
    graph = module_graph(PRODUCT + ["bench"])  # the benches' modules too (and the product they import)
    assert len(graph) > 80 and "bench.tools" in graph["bench.answers"]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan: strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []
