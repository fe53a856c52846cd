"""The package's layering, read from the source: servers -> env -> rollout -> algorithm -> trainer
-> scripts, with no module importing from a layer above its own and no import cycle between
modules. Every import counts, including those inside functions and under TYPE_CHECKING: a lazy
import still ties two modules together."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("skyrl_tool_agent", "mcp_tools")

#: Lowest first. A unit is a subpackage of skyrl_tool_agent (or a top-level module of it), or the
#: servers package mcp_tools. Units may import only from units in lower layers.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("mcp_tools",),  # servers: they stand alone below the library (see the test below)
    ("config",),  # the one config schema; knows nothing else
    ("kernels",),  # fused tensor ops (log-probs, LoRA linear, decode attention), their CPU threads: no models, no config
    ("memory",),  # the memory model: a model's shape, each quantity once, the engine and update planned together
    ("data", "rewards", "mcp", "policy"),  # tasks, scoring, the MCP client pool, the model
    ("env",),  # the skyrl-gym environment
    ("rollout",),  # agents and the trajectory collector
    ("examples",),  # task families beyond SQL (their verifier, server, tasks, scripted agent)
    ("eval",),  # evaluation runs and what they measure: metrics, anatomy, statistics
    ("grpo", "warmstart"),  # the algorithm and its trainer; the supervised warm start
    ("distributed",),  # the trainer over ZeRO-3 ranks
    ("reports",),  # what a person looks at: report.html, tables, PNGs (reads results, runs nothing)
    ("jobs",),  # one file per job (train, the arms, the speedrun, model builds, evaluate, doctor), each run opened by open_run
    ("skyrl_tool_agent",),  # the package root (version, registration with skyrl-gym)
    ("commands",),  # the scripts' entry points
)
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "mcp_tools":
        return "mcp_tools"
    if parts[0] != "skyrl_tool_agent":
        return None
    return parts[1] if len(parts) > 1 else "skyrl_tool_agent"


def imports_of(path: Path, module: str) -> set[str]:
    """Modules of ours that `path` imports (absolute or relative), resolved to existing modules."""
    found: set[str] = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {m for m in found if unit_of(m) is not None}


def import_graph() -> nx.DiGraph:
    files = {module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(files)
    for module, path in files.items():
        for target in imports_of(path, module):
            if target in files and target != module:
                graph.add_edge(module, target)
    return graph


def test_every_unit_has_a_layer():
    units = {unit_of(m) for m in import_graph().nodes}
    assert units <= set(LAYER_OF), f"units without a layer (add them to LAYERS): {sorted(units - set(LAYER_OF))}"


def test_no_module_imports_from_a_layer_above_or_beside_its_own():
    graph = import_graph()
    wrong = []
    for source, target in graph.edges:
        a, b = unit_of(source), unit_of(target)
        if a != b and LAYER_OF[b] >= LAYER_OF[a]:
            wrong.append(f"{source} -> {target} (layer {LAYER_OF[a]} imports layer {LAYER_OF[b]})")
    assert not wrong, "\n".join(wrong)


def test_the_servers_import_nothing_from_the_library():
    """mcp_tools runs as server processes any MCP client may start: no module of it imports
    skyrl_tool_agent (its config included), anywhere in the source (inside functions too)."""
    files = sorted((REPO / "mcp_tools").rglob("*.py"))
    assert {"one_file_server.py", "sqlite_server.py"} <= {p.name for p in files}
    wrong = [f"{module_name(path)} -> {target}" for path in files
             for target in sorted(imports_of(path, module_name(path))) if unit_of(target) != "mcp_tools"]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles_between_modules():
    graph = import_graph()
    # A package's __init__ re-exporting its modules and those modules importing siblings through the
    # package is the normal shape of a package, not a design cycle: drop edges into an __init__
    # from inside its own package.
    inner = [(s, t) for s, t in graph.edges if s.startswith(t + ".")]
    graph.remove_edges_from(inner)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join([*c, c[0]]) for c in cycles[:10])


@pytest.mark.parametrize("module", ["skyrl_tool_agent.policy.qwen", "skyrl_tool_agent.distributed.checkpoint"])
def test_the_graph_sees_the_modules_it_checks(module):
    # Guards the guard: a path or parsing mistake would make the tests above pass on an empty graph.
    graph = import_graph()
    assert module in graph and graph.out_degree(module) > 0
