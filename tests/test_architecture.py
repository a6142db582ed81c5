"""The architecture, checked: no import cycles, no private names across modules, small modules.

The layers themselves are import-linter contracts (``setup.cfg``,
``lint-imports`` in ``make test``); these tests check what those contracts
do not: that no two modules import each other, even through others (counting
imports under ``TYPE_CHECKING`` and inside functions), that no module uses
another module's private names, and that modules stay small.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

PACKAGE = "jupyter_traincontrol"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
#: A review flag, not a target: a module past it is looked at, to see whether
#: it holds two concepts. Counted in statements (`statements`), not lines, so
#: reflowing a docstring or merging two statements onto one line changes nothing.
MAX_MODULE_STATEMENTS = 300
MAX_CALLBACK_STATEMENTS = 100


def statements(node: ast.AST) -> int:
    """The statements in `node`, nested ones included, docstrings left out."""
    count = 0
    for child in ast.walk(node):
        if isinstance(child, ast.stmt):
            docstring = isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant) \
                and isinstance(child.value.value, str)
            count += not docstring
    return count


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        if "labextension" in path.parts:
            continue
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _strongly_connected(graph: grimp.ImportGraph, modules: set[str]) -> list[set[str]]:
    """Tarjan's algorithm over the import graph, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0
    for start in sorted(modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start) & modules)))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child) & modules))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def test_no_import_cycles_between_modules():
    graph = grimp.build_graph(PACKAGE, exclude_type_checking_imports=False, cache_dir=None)
    modules = set(graph.modules)
    cycles = [sorted(component) for component in _strongly_connected(graph, modules) if len(component) > 1]
    assert not cycles, f"import cycles: {cycles}"


def _imported_module(module: str, node: ast.ImportFrom, is_package: bool) -> str | None:
    if node.level == 0:
        return node.module if node.module and node.module.startswith(PACKAGE) else None
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def test_no_module_uses_another_modules_private_names():
    modules = _modules()
    problems = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        imported_modules = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _imported_module(module, node, path.name == "__init__.py")
                if source is None or source == module:
                    continue
                for alias in node.names:
                    name = alias.name
                    if f"{source}.{name}" in modules:
                        imported_modules[alias.asname or name] = f"{source}.{name}"
                    elif name.startswith("_") and not name.startswith("__"):
                        problems.append(f"{module} imports {source}.{name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith(PACKAGE) and alias.asname:
                        imported_modules[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in imported_modules and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                problems.append(f"{module} uses {imported_modules[node.value.id]}.{node.attr}")
    assert not problems, problems


@pytest.mark.parametrize("module", sorted(_modules()))
def test_modules_stay_small(module):
    count = statements(ast.parse(_modules()[module].read_text()))
    assert count <= MAX_MODULE_STATEMENTS, (
        f"{module} has {count} statements; past {MAX_MODULE_STATEMENTS}, look whether it holds two concepts")


def test_the_statement_count_leaves_out_docstrings_and_layout():
    one = "def f(x):\n    \"\"\"Doc.\"\"\"\n    a = x\n    b = a\n    return b\n"
    reflowed = "def f(x):\n    \"\"\"Doc,\n\n    longer.\n    \"\"\"\n    a = x; b = a\n    return b\n"
    assert statements(ast.parse(one)) == statements(ast.parse(reflowed)) == 4


def test_control_callback_keeps_the_keras_hooks_only():
    tree = ast.parse((ROOT / "fit" / "callback.py").read_text())
    (callback,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ControlCallback"]
    count = statements(callback)
    assert count <= MAX_CALLBACK_STATEMENTS, (
        f"ControlCallback has {count} statements; expected at most {MAX_CALLBACK_STATEMENTS} (its Keras hooks)")


def _progress_fields() -> set[str]:
    tree = ast.parse((ROOT / "boundary" / "progress.py").read_text())
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "TrainingProgress"]
    (init,) = [node for node in cls.body if isinstance(node, ast.FunctionDef) and node.name == "__init__"]
    return {target.attr for node in ast.walk(init) for target in _written(node) if isinstance(target, ast.Attribute)}


def _written(node: ast.AST) -> list[ast.AST]:
    """The targets an assignment writes, tuples unpacked."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
    flat = []
    while targets:
        target = targets.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            targets.extend(target.elts)
        else:
            flat.append(target)
    return flat


def test_only_training_progress_writes_its_counters():
    """`TrainingProgress`'s counters and flags are written by its own methods
    only, named for what happened at a boundary: no driver or action sets
    them itself (found as an assignment to ``progress.FIELD``,
    ``self.progress.FIELD`` or ``self._progress.FIELD``)."""
    fields = _progress_fields()
    assert {"epoch", "step", "boundary", "mid_epoch", "pinned", "version"} <= fields
    problems = []
    for module, path in _modules().items():
        if module == f"{PACKAGE}.boundary.progress":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _written(node):
                receiver = getattr(target, "value", None)
                names_progress = (isinstance(receiver, ast.Name) and receiver.id == "progress") or (
                    isinstance(receiver, ast.Attribute) and receiver.attr in ("progress", "_progress"))
                if isinstance(target, ast.Attribute) and target.attr in fields and names_progress:
                    problems.append(f"{module}:{node.lineno} writes {ast.unparse(target)}")
    assert not problems, problems


def test_the_top_level_is_the_entry_points_and_at_most_three_small_files():
    files = sorted(path.name for path in ROOT.glob("*.py") if path.name != "__init__.py")
    assert len(files) <= 3, files
    for name in files:
        assert len((ROOT / name).read_text().splitlines()) <= 20, name
