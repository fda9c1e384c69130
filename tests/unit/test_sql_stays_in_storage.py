"""SQL and the database driver's errors stay in ``storage/``: read from the source.

Outside ``reconciler.storage`` no module imports SQLAlchemy's errors (``sqlalchemy.exc``:
``storage.database.translate_errors`` maps every one of them to an error of
``core.errors``, which is what a route or a step catches), builds a statement
(``text``, ``select``, ``insert``, ``update``, ``delete``) or runs one (``execute``,
``exec_driver_sql``, ``scalar``; ``storage.fastsql``). A connection may pass through as a
type (``sqlalchemy.engine.Connection``) and a URL may be parsed (``make_url``): neither
speaks to the database. Inside it, a model's table is read in one place
(``storage.tables.table_of``), so one table has one handle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "service" / "reconciler"
STORAGE = ROOT / "storage"
TABLES = STORAGE / "tables.py"

SA_NAMES = frozenset({"exc", "text", "select", "insert", "update", "delete", "sql", "func"})
SA_SUBMODULES = [[name] for name in sorted(SA_NAMES)]
RUNS_SQL = frozenset({"execute", "executemany", "exec_driver_sql", "scalar", "scalars"})


def _sqlalchemy_aliases(tree: ast.Module) -> set[str]:
    names = {"sqlalchemy"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name for a in node.names if a.name == "sqlalchemy")
    return names


def _imports(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [
            f"import {a.name}"
            for a in node.names
            if a.name == "reconciler.storage.fastsql"
            or (a.name.split(".")[0] == "sqlalchemy" and a.name.split(".")[1:2] in SA_SUBMODULES)
        ]
    module = node.module or ""
    if node.level:
        return []
    if module == "sqlalchemy":
        return [f"from sqlalchemy import {a.name}" for a in node.names if a.name in SA_NAMES]
    if module.split(".")[0] == "sqlalchemy" and module.split(".")[1:2] in SA_SUBMODULES:
        return [f"from {module} import ..."]
    if module == "reconciler.storage.fastsql" or (
        module == "reconciler.storage" and any(a.name == "fastsql" for a in node.names)
    ):
        return ["imports storage.fastsql"]
    return []


def sql_outside_storage(source: str) -> list[str]:
    """What in ``source`` speaks SQL or handles the driver's errors, one line each."""
    tree = ast.parse(source)
    aliases = _sqlalchemy_aliases(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        hits: list[str] = []
        if isinstance(node, ast.Import | ast.ImportFrom):
            hits = _imports(node)
        elif isinstance(node, ast.Attribute) and node.attr in SA_NAMES:
            if isinstance(node.value, ast.Name) and node.value.id in aliases:
                hits = [f"{node.value.id}.{node.attr}"]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            hits = [f".{node.func.attr}(...)"] if node.func.attr in RUNS_SQL else []
        found.extend(f"line {getattr(node, 'lineno', 0)}: {hit}" for hit in hits)
    return found


def tables_read(source: str) -> list[str]:
    """Where ``source`` reads a model's ``__table__`` (as an attribute or by name)."""
    return [
        f"line {node.lineno}: __table__"
        for node in ast.walk(ast.parse(source))
        if (isinstance(node, ast.Attribute) and node.attr == "__table__")
        or (isinstance(node, ast.Constant) and node.value == "__table__")
    ]


def _modules() -> list[Path]:
    paths = sorted(ROOT.rglob("*.py"))
    assert len(paths) > 100, "the package was not found"
    return paths


def test_no_module_outside_storage_speaks_sql_or_catches_driver_errors() -> None:
    found = {
        str(path.relative_to(ROOT)): hits
        for path in _modules()
        if STORAGE not in path.parents
        and (hits := sql_outside_storage(path.read_text(encoding="utf-8")))
    }
    assert not found, found


def test_a_models_table_is_read_only_by_storage_tables() -> None:
    found = {
        str(path.relative_to(ROOT)): hits
        for path in _modules()
        if path != TABLES and (hits := tables_read(path.read_text(encoding="utf-8")))
    }
    assert not found, found
    assert tables_read(TABLES.read_text(encoding="utf-8")), "table_of reads __table__"


@pytest.mark.parametrize(
    "source",
    [
        "import sqlalchemy as sa\ntry:\n    pass\nexcept sa.exc.DataError:\n    pass\n",
        "from sqlalchemy.exc import IntegrityError\n",
        "from sqlalchemy import exc\n",
        "import sqlalchemy.exc\n",
        "import sqlalchemy\nq = sqlalchemy.text('SELECT 1')\n",
        "from sqlalchemy import select\n",
        "def f(conn):\n    conn.execute(query)\n",
        "def f(conn):\n    conn.exec_driver_sql('SELECT 1')\n",
        "from reconciler.storage.fastsql import Sql\n",
        "from reconciler.storage import fastsql\n",
    ],
)
def test_the_rule_catches_sql_and_driver_errors(source: str) -> None:
    assert sql_outside_storage(source), source


@pytest.mark.parametrize(
    "source",
    [
        "from sqlalchemy.engine import Connection\n",
        "import sqlalchemy as sa\nurl = sa.make_url('sqlite://')\n",
        "from reconciler.storage.database import Database\n",
    ],
)
def test_the_rule_lets_types_and_urls_through(source: str) -> None:
    assert not sql_outside_storage(source), source


def test_the_table_rule_catches_a_second_handle() -> None:
    assert tables_read("EVENTS = WebhookEvent.__table__\n")
    assert tables_read("EVENTS = getattr(WebhookEvent, '__table__')\n")


def test_table_of_gives_the_models_table_and_refuses_a_plain_model() -> None:
    from sqlmodel import SQLModel

    from reconciler.storage.models import Operation
    from reconciler.storage.tables import OPS, table_of

    class Plain(SQLModel):
        name: str

    assert table_of(Operation) is OPS and OPS.name == "operations"
    with pytest.raises(TypeError, match="Plain declares no table"):
        table_of(Plain)
