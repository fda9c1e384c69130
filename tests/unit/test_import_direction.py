"""Which package of the service may import which: read from the source, nothing imported.

Layers, lowest first. A module imports its own layer or lower ones, never a higher one:

    =====  ===============================================  =======================================
    layer  packages (under ``reconciler``)                  what they are
    =====  ===============================================  =======================================
    0      core, __init__                                   pure decisions, values, errors
    1      config, logs, metrics, wire, tracing, telemetry  settings, logs, counters, shapes, spans
    2      providers                                        the provider files and adapters
    3      storage, outbound                                the database; calls to agents
    4      engine                                           the worker, its steps, the ticker
    5      runtime                                          what a running service holds
    6      commands, inbound                                what the doors share
    7      api, console, agent_tools, client                the doors, and the client library
    8      app                                              the composition root
    9      cli, demo, __main__                              the command line
    =====  ===============================================  =======================================

The doors are where a request comes in: ``api`` (the HTTP API and the webhook endpoint),
``console``, ``agent_tools`` (MCP) and the command line (``cli``, ``demo`` and ``__main__``
are one door). No door imports another: what two of them need is below them, in
``commands`` (the actions every door performs: the agent's actions, the writes, the
checks of what callers send) or ``inbound`` (the HTTP pieces: auth, body reading, error
answers, the JSON encoding). ``commands`` is that shared layer, not a door: no request
reaches it but through a door, and were it a door the others could not call it. The
command line sits above the root because it starts things: ``reconciler serve`` the app,
``reconciler mcp`` the stdio agent tools (``agent_tools.stdio``, the one door module it
may import: starting a door is not leaning on it). ``client`` is the library agents
install, not a door: the stdio tools use it as any agent would.

A door reaches the database only through ``commands`` (and ``inbound.auth``, which checks
a request's token): what it reads or writes there is a function named for what it reads
or does (``commands.operator_reads``, ``inbox_reads``, ``provider_reads``, ``tokens``,
``database``, the actions and the writes). So two doors that read the same thing read it
the same way, with the same visibility rule, and storage can change under the doors
without touching them. From ``storage`` a door takes only plain values, by name: a class
that neither holds nor takes a connection or a database handle (the rows a read answers
with, a filter it passes, an error to catch), never a module, a function, a constant or
a handle; and it imports no SQLAlchemy, since it holds no connection.

Besides the layers: ``core`` imports nothing of ours outside ``core``; ``storage`` imports
no engine, door or root; the engine receives its dependencies (``engine.deps``) and imports
neither the runtime nor a door; the client library, imported by agents, reaches
(directly or through what it imports) nothing server-side. No module imports itself
through others: in an import circle the order of the imports decides what each module
finds half made, and two modules that need each other are one job in two files or lack
a value or protocol between them (the lower one states what it needs; the higher hands
it over). Every import counts, also one inside a function or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "reconciler"
ROOT = Path(__file__).resolve().parents[2] / "service" / PACKAGE

# The table of the docstring, lowest first.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core", "__init__"),
    ("config", "logs", "metrics", "wire", "tracing", "telemetry"),
    ("providers",),
    ("storage", "outbound"),
    ("engine",),
    ("runtime",),
    ("commands", "inbound"),
    ("api", "console", "agent_tools", "client"),
    ("app",),
    ("cli", "demo", "__main__"),
)
LAYER_OF: dict[str, int] = {part: n for n, parts in enumerate(LAYERS) for part in parts}

# Each door, by the packages it is made of (the command line is three).
DOOR_OF: dict[str, str] = {
    "api": "api",
    "console": "console",
    "agent_tools": "agent_tools",
    "cli": "command line",
    "demo": "command line",
    "__main__": "command line",
}
DOORS = frozenset(DOOR_OF)
# What the doors share, below them.
SHARED = frozenset({"commands", "inbound"})
# The door modules the command line starts (``reconciler mcp``); it imports no other.
STARTED_BY_THE_COMMAND_LINE = frozenset({"reconciler.agent_tools.stdio"})
TOP = frozenset({"runtime", "app", "__main__"})
# What the client library may reach: what an agent installs it for, and nothing that
# pulls in the server's stack.
CLIENT_REACH = frozenset({"client", "core", "wire", "__init__"})

Graph = Mapping[str, frozenset[str]]


@dataclass(frozen=True)
class Violation:
    importer: str
    imported: str
    rule: str

    def __str__(self) -> str:
        return f"{self.importer} imports {self.imported}: {self.rule}"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def part_of(module: str) -> str:
    """The table's name for a module: its first package under ``reconciler``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imported(tree: ast.Module, module: str, is_package: bool, known: frozenset[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            # ``from reconciler.core import errors`` imports the module ``reconciler.core.errors``
            # (the package is only its way there); a name defined in the package imports it.
            modules = {f"{target}.{a.name}" for a in node.names} & known
            found.update(modules)
            if len(modules) < len(node.names):
                found.add(target)
    return {name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")}


def import_graph(root: Path = ROOT) -> dict[str, frozenset[str]]:
    """Every module of ours, with the modules of ours it imports."""
    paths = sorted(root.rglob("*.py"))
    known = frozenset(module_name(p, root) for p in paths)
    graph: dict[str, frozenset[str]] = {}
    for path in paths:
        name = module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[name] = frozenset(_imported(tree, name, path.name == "__init__.py", known))
    return graph


def reach(graph: Graph, start: Iterable[str]) -> dict[str, str]:
    """Every module reachable from ``start``, with the module that first imports it."""
    seen: dict[str, str] = {}
    todo = list(start)
    while todo:
        here = todo.pop()
        for there in graph.get(here, frozenset()):
            if there not in seen:
                seen[there] = here
                todo.append(there)
    return seen


def unknown_parts(graph: Graph) -> list[str]:
    return sorted({part_of(m) for m in graph} - LAYER_OF.keys())


def layer_violations(graph: Graph) -> list[Violation]:
    found = []
    for importer, imported in graph.items():
        if part_of(importer) == "core":
            continue  # core's own rule is stricter: nothing of ours outside core
        low = LAYER_OF.get(part_of(importer))
        for target in sorted(imported):
            high = LAYER_OF.get(part_of(target))
            if low is not None and high is not None and high > low:
                rule = f"layer {low} ({part_of(importer)}) may not import layer {high}"
                found.append(Violation(importer, target, rule))
    return found


def core_violations(graph: Graph) -> list[Violation]:
    return [
        Violation(importer, target, "core imports only core")
        for importer, imported in graph.items()
        if part_of(importer) == "core"
        for target in sorted(imported)
        if part_of(target) != "core"
    ]


def storage_violations(graph: Graph) -> list[Violation]:
    above = DOORS | SHARED | TOP | {"engine"}
    return [
        Violation(importer, target, "storage imports no engine, door or root")
        for importer, imported in graph.items()
        if part_of(importer) == "storage"
        for target in sorted(imported)
        if part_of(target) in above
    ]


def engine_violations(graph: Graph) -> list[Violation]:
    above = DOORS | SHARED | TOP
    return [
        Violation(importer, target, "the engine takes engine.deps, not the runtime or a door")
        for importer, imported in graph.items()
        if part_of(importer) == "engine"
        for target in sorted(imported)
        if part_of(target) in above
    ]


def door_violations(graph: Graph) -> list[Violation]:
    found = []
    for importer, imported in graph.items():
        door = DOOR_OF.get(part_of(importer))
        if door is None:
            continue
        for target in sorted(imported):
            other = DOOR_OF.get(part_of(target))
            if other is None or other == door:
                continue
            if door == "command line" and target in STARTED_BY_THE_COMMAND_LINE:
                continue
            rule = f"no door imports another ({door} imports {other}): share it from below"
            found.append(Violation(importer, target, rule))
    return found


def circles(graph: Graph) -> list[list[str]]:
    """Each import circle: for each group of modules that reach one another, a shortest
    way round from its first module (by name) back to it."""
    reached = {module: set(reach(graph, [module])) for module in graph}
    found = []
    done: set[str] = set()
    for start in sorted(graph):
        if start in done or start not in reached[start]:
            continue
        group = {start} | {m for m in reached[start] if start in reached.get(m, set())}
        done |= group
        found.append(_way_round(graph, start, group))
    return found


def _way_round(graph: Graph, start: str, group: set[str]) -> list[str]:
    came_from: dict[str, str] = {}
    todo = [start]
    while todo:
        here = todo.pop(0)
        for there in sorted(graph.get(here, frozenset()) & group):
            if there == start:
                way = [here]
                while way[-1] != start:
                    way.append(came_from[way[-1]])
                return [*reversed(way), start]
            if there not in came_from:
                came_from[there] = here
                todo.append(there)
    raise AssertionError(f"{start} is in no circle")


def circle_violations(graph: Graph) -> list[Violation]:
    return [
        Violation(way[0], way[1], "no import circle: " + " -> ".join(way)) for way in circles(graph)
    ]


def client_violations(graph: Graph) -> list[Violation]:
    client = [m for m in graph if part_of(m) == "client"]
    return [
        Violation(via, target, "the client library reaches nothing server-side")
        for target, via in sorted(reach(graph, client).items())
        if part_of(target) not in CLIENT_REACH
    ]


RULES = {
    "layers": layer_violations,
    "core": core_violations,
    "storage": storage_violations,
    "engine": engine_violations,
    "doors": door_violations,
    "client": client_violations,
    "circles": circle_violations,
}


# A class that names one of these holds or takes the database: not a plain value.
DATABASE_HANDLES = frozenset({"Connection", "Engine", "Database"})
# What doors take from below, by name: (module, name); a whole module is (module, "*").
Taken = Mapping[str, frozenset[tuple[str, str]]]


def storage_values(root: Path = ROOT) -> dict[str, frozenset[str]]:
    """Each storage module's plain values: its classes that name no database handle."""
    found = {}
    for path in sorted((root / "storage").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found[module_name(path, root)] = frozenset(
            node.name
            for node in tree.body
            if isinstance(node, ast.ClassDef) and not _names_a_handle(node)
        )
    return found


def _names_a_handle(node: ast.ClassDef) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id in DATABASE_HANDLES)
        or (isinstance(n, ast.Attribute) and n.attr in DATABASE_HANDLES)
        for n in ast.walk(node)
    )


def taken_by_doors(root: Path = ROOT) -> dict[str, frozenset[tuple[str, str]]]:
    """What each door module imports from storage and from SQLAlchemy, name by name."""
    paths = sorted(root.rglob("*.py"))
    known = frozenset(module_name(p, root) for p in paths)
    below = (f"{PACKAGE}.storage", "sqlalchemy")
    found = {}
    for path in paths:
        name = module_name(path, root)
        if part_of(name) not in DOORS:
            continue
        taken: set[tuple[str, str]] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                taken.update((a.name, "*") for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    whole = f"{node.module}.{alias.name}"
                    taken.add((whole, "*") if whole in known else (node.module, alias.name))
        found[name] = frozenset(
            (module, what) for module, what in taken if module.startswith(below)
        )
    return found


def door_reach_violations(taken: Taken, values: Mapping[str, frozenset[str]]) -> list[Violation]:
    found = []
    for importer, items in sorted(taken.items()):
        for module, what in sorted(items):
            if module.split(".")[0] == "sqlalchemy":
                rule = "a door holds no connection: it imports no SQLAlchemy"
            elif what not in values.get(module, frozenset()):
                rule = (
                    "a door reaches the database through commands: from storage it takes "
                    "plain values and errors only, by name"
                )
            else:
                continue
            found.append(Violation(importer, module if what == "*" else f"{module}.{what}", rule))
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, frozenset[str]]:
    return import_graph()


def test_the_whole_package_is_read(graph: Graph) -> None:
    # A wrong path would find nothing and every rule would pass.
    assert len(graph) > 100
    assert "reconciler.engine.worker" in graph["reconciler.engine.background"]
    assert unknown_parts(graph) == [], "add the new package to LAYERS (and to the docstring)"


def test_the_docstring_states_the_table() -> None:
    rows = [re.split(r"\s{2,}", line.strip()) for line in (__doc__ or "").splitlines()]
    table = {
        int(row[0]): tuple(p.strip(" `") for p in row[1].split(","))
        for row in rows
        if len(row) == 3 and row[0].isdigit()
    }
    assert table == dict(enumerate(LAYERS))


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_holds(graph: Graph, rule: str) -> None:
    found = RULES[rule](graph)
    assert not found, "\n".join(str(v) for v in found)


BAD: dict[str, dict[str, frozenset[str]]] = {
    "layers": {"reconciler.storage.x": frozenset({"reconciler.engine.y"})},
    "core": {"reconciler.core.x": frozenset({"reconciler.config"})},
    "storage": {"reconciler.storage.x": frozenset({"reconciler.api.y"})},
    "engine": {"reconciler.engine.x": frozenset({"reconciler.runtime"})},
    "doors": {"reconciler.api.x": frozenset({"reconciler.console.y"})},
    "client": {
        "reconciler.client.x": frozenset({"reconciler.core.y"}),
        "reconciler.core.y": frozenset({"reconciler.storage.z"}),
    },
    "circles": {
        "reconciler.engine.x": frozenset({"reconciler.engine.y"}),
        "reconciler.engine.y": frozenset({"reconciler.engine.z"}),
        "reconciler.engine.z": frozenset({"reconciler.engine.x"}),
    },
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_catches_a_wrong_import(rule: str) -> None:
    assert RULES[rule](BAD[rule]), f"the {rule} rule let a wrong import through"


def test_relative_and_from_package_imports_are_resolved(tmp_path: Path) -> None:
    pkg = tmp_path / PACKAGE
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "runtime.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("")
    (pkg / "engine" / "a.py").write_text(
        "from .. import runtime\ndef f() -> None:\n    from reconciler.engine import b\n"
    )
    (pkg / "engine" / "b.py").write_text("")
    graph = import_graph(pkg)
    assert graph["reconciler.engine.a"] >= {"reconciler.runtime", "reconciler.engine.b"}
    assert engine_violations(graph)


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("reconciler.api.actions", "reconciler.console.providers"),
        ("reconciler.console.web", "reconciler.api.auth"),
        ("reconciler.agent_tools.http", "reconciler.api.errors"),
        ("reconciler.cli.operations", "reconciler.agent_tools.backends"),
        ("reconciler.demo.run", "reconciler.api.operations"),
    ],
)
def test_the_door_rule_catches_one_door_leaning_on_another(importer: str, imported: str) -> None:
    assert door_violations({importer: frozenset({imported})})


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("reconciler.cli", "reconciler.agent_tools.stdio"),  # reconciler mcp starts it
        ("reconciler.cli", "reconciler.demo.run"),  # one door: the command line
        ("reconciler.api.operations", "reconciler.commands.agent_actions"),
        ("reconciler.console.web", "reconciler.inbound.auth"),
        ("reconciler.agent_tools.stdio", "reconciler.client"),
    ],
)
def test_the_door_rule_lets_shared_pieces_and_starts_through(importer: str, imported: str) -> None:
    assert not door_violations({importer: frozenset({imported})})


def test_doors_reach_the_database_only_through_commands() -> None:
    taken = taken_by_doors()
    assert taken["reconciler.console.timeline"], "the doors' imports were not read"
    found = door_reach_violations(taken, storage_values())
    assert not found, "\n".join(str(v) for v in found)


VALUES = {
    "reconciler.storage.x": frozenset({"Row", "Refused"}),
    "reconciler.storage.journal": frozenset(),
}


@pytest.mark.parametrize(
    "taken",
    [
        ("reconciler.storage.x", "*"),  # from reconciler.storage import x
        ("reconciler.storage.x", "read_rows"),  # a function
        ("reconciler.storage.x", "MAX_ROWS"),  # a constant
        ("reconciler.storage.journal", "Journal"),  # a class that takes a connection
        ("sqlalchemy.engine", "Connection"),
    ],
)
def test_the_reach_rule_catches_a_door_reading_storage(taken: tuple[str, str]) -> None:
    assert door_reach_violations({"reconciler.console.x": frozenset({taken})}, VALUES)


def test_the_reach_rule_lets_plain_values_and_errors_through() -> None:
    taken = {("reconciler.storage.x", "Row"), ("reconciler.storage.x", "Refused")}
    assert not door_reach_violations({"reconciler.cli.x": frozenset(taken)}, VALUES)


def test_a_class_that_holds_or_takes_the_database_is_no_plain_value(tmp_path: Path) -> None:
    storage = tmp_path / PACKAGE / "storage"
    storage.mkdir(parents=True)
    (storage / "x.py").write_text(
        "class Row:\n    n: int\n"
        "class Refused(Exception):\n    pass\n"
        "class Reader:\n    def read(self, conn: Connection) -> None: ...\n"
        "class Holder:\n    db: storage.Database\n"
    )
    values = storage_values(tmp_path / PACKAGE)
    assert values["reconciler.storage.x"] == {"Row", "Refused"}
