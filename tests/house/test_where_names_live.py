"""No re-export hubs: a module imports each name from the module that defines it, never through one that
only imported it too (a test or a benchmark reaching a private helper through the stage that uses it
couples the three); and no module of the code imports a name it does not use, which is how a hub starts.
runs.models is the one aggregator, for Django's app loading (tests/house/test_runs_layers.py keeps runs/
code off it).
"""
import ast
from pathlib import Path

from tests.house.test_import_graph import ROOT

PACKAGES = ("eagle3web", "runs", "workers", "bench", "tests")
AGGREGATORS = {"runs.models"}


def _files():
    return [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "migrations" not in p.parts]


def _module_file(module: str) -> Path | None:
    base = ROOT / module.replace(".", "/")
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _top_level(tree: ast.Module):
    """Statements run when the module is imported (inside if/try too, not inside functions or classes)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            stack += node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body]


_BORROWED: dict[str, dict[str, str]] = {}


def borrowed(module: str) -> dict[str, str]:
    """Names `module` binds by importing them from another module of the house (and does not define again)."""
    if module not in _BORROWED:
        path = _module_file(module)
        names, defined = {}, set()
        if path is not None:
            for node in _top_level(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module and not node.level \
                        and node.module.split(".")[0] in PACKAGES:
                    for alias in node.names:
                        names[alias.asname or alias.name] = node.module
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    defined.add(node.name)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    defined.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        _BORROWED[module] = {name: origin for name, origin in names.items() if name not in defined}
    return _BORROWED[module]


def test_names_are_imported_from_where_they_live():
    through = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and not node.level) \
                    or node.module.split(".")[0] not in PACKAGES or node.module in AGGREGATORS:
                continue
            for alias in node.names:
                if _module_file(f"{node.module}.{alias.name}") is None and alias.name in borrowed(node.module):
                    through.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} from {node.module}, "
                                   f"which has it from {borrowed(node.module)[alias.name]}")
    assert through == []


def test_no_module_imports_a_name_it_does_not_use():
    """Tests are left out: pytest asks for an imported fixture by name, also from other fixtures. A name other
    modules read only as `module.name` is not used by the module that imported it: that is a hub too."""
    unused = []
    for path in _files():
        if path.relative_to(ROOT).parts[0] == "tests":
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module in AGGREGATORS:
            continue
        tree = ast.parse(path.read_text())
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        for node in _top_level(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                unused += [f"{path.relative_to(ROOT)}:{node.lineno}: {alias.asname or alias.name}"
                           for alias in node.names if (alias.asname or alias.name) not in used]
    assert unused == []
