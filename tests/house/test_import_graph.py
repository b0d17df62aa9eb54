"""The house has one way through: no module of eagle3web, runs, workers, bench or tests imports,
directly or through others, a module that imports it back. Lazy imports inside functions count too, and
`if TYPE_CHECKING:` blocks (types, never run) as well. The web tier and the workers meet at one
boundary, workers.contract."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("eagle3web", "runs", "workers", "bench", "tests")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str], *, typing: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    skipped = set() if typing else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for child in node.body for n in ast.walk(child)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph(*, typing: bool = False) -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "migrations" not in p.parts]
    known = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, known, typing=typing) - {module_name(p)} for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_module_imports_itself_back():
    graph = import_graph()
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}  # a package's own __init__
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_no_module_imports_itself_back_even_for_types():
    """A type one module needs from another that imports it lives in the wrong module: move it."""
    graph = import_graph(typing=True)
    graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def top_level_imports(path: Path) -> set[str]:
    """What a module imports when it is imported: statements outside functions (a function's own
    imports run only where it is called) and outside `if TYPE_CHECKING:`."""
    found: set[str] = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit(getattr(node, field, []) or [])

    visit(ast.parse(path.read_text()).body)
    return found


# workers/ in two halves, each a folder: workers.orchestration, the Django-facing half, takes a job from the
# queue, reads and writes rows through runs/ services and calls the compute half with plain arguments; the
# compute half is torch and files, run from a test or a notebook with no database. Every module of workers/ is
# in one of these folders (the package's own __init__ aside), so a new file says by where it lies which half
# it is in.
WORKERS_HALVES = {
    "workers.orchestration": "django",    # Celery tasks, stage runners, claims, fleet, system metrics, online tasks
    "workers.stages": "compute",          # prepare, extract, vocab, train, evaluate: plain functions over paths
    "workers.contract": "compute",        # torch-free, shared with the web tier
    "workers.vllm_plugins": "compute",    # loaded inside `vllm serve`, which has no Django
}
DJANGO_SIDE = ("django", "celery", "kombu", "runs", "eagle3web")


def _half(module: str) -> str | None:
    if module == "workers":
        return "compute"  # the package's __init__: empty, it imports nothing
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in WORKERS_HALVES:
            return WORKERS_HALVES[".".join(parts[:end])]
    return None


def _all_imports(path: Path) -> set[str]:
    """Every module a file imports, at import time or inside a function, for types too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_every_part_of_workers_is_in_one_half():
    unplaced = sorted(module_name(p) for p in (ROOT / "workers").rglob("*.py") if _half(module_name(p)) is None)
    assert unplaced == []


def test_workers_holds_its_two_halves_and_nothing_loose():
    """Directly under workers/ only the halves' folders (and the package's __init__): a module of its own
    there would be in neither folder, and a reader could not tell which half may import Django."""
    loose = sorted(p.name for p in (ROOT / "workers").iterdir()
                   if p.name != "__init__.py" and not p.name.startswith(".") and p.name != "__pycache__"
                   and f"workers.{p.stem}" not in WORKERS_HALVES)
    assert loose == []


def test_the_compute_half_of_workers_imports_no_django_celery_nor_the_app():
    offenders = {}
    for path in (ROOT / "workers").rglob("*.py"):
        if _half(module_name(path)) == "compute":
            bad = sorted(i for i in _all_imports(path) if i.split(".")[0] in DJANGO_SIDE)
            if bad:
                offenders[module_name(path)] = bad
    assert offenders == {}


def test_the_compute_half_imports_nothing_of_the_django_half():
    graph = import_graph()
    offenders = {m: sorted(d for d in deps if _half(d) == "django")
                 for m, deps in graph.items() if m.startswith("workers") and _half(m) == "compute"}
    assert {m: d for m, d in offenders.items() if d} == {}


def test_the_contract_imports_no_stage():
    """workers.contract is what the web tier and the workers share: it imports nothing else of workers/."""
    graph = import_graph()
    offenders = {m: sorted(d for d in deps if d.startswith("workers") and not d.startswith("workers.contract"))
                 for m, deps in graph.items() if m.startswith("workers.contract")}
    assert {m: d for m, d in offenders.items() if d} == {}


def test_the_contract_imports_no_torch_when_imported():
    heavy = ("torch", "transformers", "speculators", "vllm", "safetensors", "datasets")
    offenders = {str(p.relative_to(ROOT)): sorted(i for i in top_level_imports(p) if i.split(".")[0] in heavy)
                 for p in (ROOT / "workers" / "contract").rglob("*.py")}
    assert {m: d for m, d in offenders.items() if d} == {}


def test_the_web_tier_imports_only_the_contract_of_workers():
    """The one boundary: what runs/ and eagle3web/ import of workers/ when they are imported is workers.contract;
    a stage is imported only inside a function a worker or a command runs."""
    offenders = {}
    for pkg in ("runs", "eagle3web"):
        for p in (ROOT / pkg).rglob("*.py"):
            bad = sorted(i for i in top_level_imports(p)
                         if i.split(".")[0] == "workers" and not i.startswith("workers.contract"))
            if bad:
                offenders[str(p.relative_to(ROOT))] = bad
    assert offenders == {}


# Modules of runs/ that may import workers/ beyond the contract inside a function, and why. Each is a
# management command that runs a worker's job in its own process (`--inline`, a shell's evaluation or serve
# check, building the demo's assets): a worker-side entry point a person starts, never loaded by the web
# server. Nothing else of runs/ or eagle3web/ may, not even lazily.
WORKER_SIDE_COMMANDS = {
    "runs.management.commands.build_demo_assets": "builds the demo target and its chats with the stage's own code",
    "runs.management.commands.evaluate_checkpoint": "measures acceptance in this process (orchestration.tasks)",
    "runs.management.commands.launch_sweep": "--inline runs the sweep's runs in this process (orchestration.tasks)",
    "runs.management.commands.regenerate_dataset": "--inline regenerates in this process (orchestration.tasks)",
    "runs.management.commands.run_pipeline": "--inline runs the pipeline in this process (orchestration.tasks)",
    "runs.management.commands.serve_check": "serves the checkpoint with vLLM in this process (orchestration.tasks)",
}
# Imports under `if TYPE_CHECKING:` never run; runs.pipeline.lifecycle.result_records names the stages' result
# dataclasses in its annotations only (the worker that ran the stage passes the object in). Moving them into
# the contract would move the stages' own result types, which carry the stages' fields, away from the code
# that fills them; an annotation costs the web tier no import, so these stay, and only these.
TYPE_ONLY = {"runs.pipeline.lifecycle.result_records": {
    "workers.stages.evaluate.measure", "workers.stages.extract.output.result", "workers.stages.prepare.stage",
    "workers.stages.evaluate.serve_check", "workers.stages.train.results", "workers.stages.vocab"}}


def test_the_web_tier_imports_nothing_of_workers_but_the_contract_not_even_lazily():
    """runs/ and eagle3web/ import workers.contract only, whether at import time, inside a function or for
    types, but for the listed worker-side commands and type-only names."""
    with_types, without_types = import_graph(typing=True), import_graph()
    offenders = {}
    for module, deps in with_types.items():
        if not module.startswith(("runs", "eagle3web")) or module in WORKER_SIDE_COMMANDS:
            continue
        typed_only = deps - without_types[module]
        bad = sorted(d for d in deps if d.startswith("workers") and not d.startswith("workers.contract")
                     and not (d in typed_only and d in TYPE_ONLY.get(module, ())))
        if bad:
            offenders[module] = bad
    assert offenders == {}


def test_the_listed_exceptions_still_need_their_exception():
    """An exception no longer needed goes from the lists above, so that it cannot hide a new import."""
    with_types, without_types = import_graph(typing=True), import_graph()
    unneeded = [m for m in WORKER_SIDE_COMMANDS
                if not any(d.startswith("workers") and not d.startswith("workers.contract") for d in with_types[m])]
    unneeded += [f"{m}: {d}" for m, names in TYPE_ONLY.items() for d in names
                 if d not in with_types[m] or d in without_types[m]]
    assert unneeded == []
