"""runs/ reads top to bottom: each domain (a folder of runs/, or a module directly under it) imports
only the domains on the floors below its own, so a change to one ripples down, never back up. The
table is FLOORS; what still runs back up is BACK_IMPORTS, a list that may only shrink (a back-import
removed must leave it, a new one fails). Lazy imports inside functions count: they run too. With
no back-import, no two domains can import each other in a circle (test_import_graph.py checks the
modules themselves).

Where a lower domain must let a higher one react (a stage failed: an alert; a run finished: its
sweep's next runs), it sends a Django signal it declares (runs/pipeline/lifecycle/signals.py) and the higher one
connects a receiver in RunsConfig.ready (runs/apps.py).

    .venv/bin/python tests/house/test_runs_layers.py    # prints the graph's counts as JSON
"""
from __future__ import annotations

import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Bottom to top. runs/models.py only gathers every domain's models for Django's app loading: it
# stands on its own top floor, so a domain importing it is importing back up.
FLOORS = [
    {"roles", "admin_bases", "live"},     # who may do what; the admin's base classes; live polls' cache
    {"projects"},                         # projects, members, the one visibility rule
    {"data"},                             # targets, datasets, curation, extractions
    {"pipeline"},                         # runs, stages, attempts, the queue and its routing, jobs
    {"checkpoints", "fleet"},             # checkpoints and their measurements; workers
    {"tracking"},                         # curves, the runs table, comparison
    {"review", "sweeps"},                 # reviews and tags; sweeps
    {"alerts", "saved_views", "reports"},
    {"web"},                              # the pages
    {"api"},                              # the REST API, over the pages' forms and selectors
    {"management", "admin", "apps"},      # commands, the admin, the app's wiring (signal receivers)
    {"models"},                           # the aggregator, for Django alone
]
FLOOR = {domain: index for index, domains in enumerate(FLOORS) for domain in domains}

# (importer, imported): back-imports still to remove. Shrinks only.
BACK_IMPORTS = {
    ("data", "fleet"), ("data", "pipeline"),
    ("pipeline", "checkpoints"), ("pipeline", "fleet"), ("pipeline", "tracking"),
    ("projects", "pipeline"), ("projects", "review"),
}


def domain_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "runs" and len(parts) > 1 else None


def domain_imports() -> dict[tuple[str, str], set[str]]:
    """(importer, imported) -> the files that import so, every import statement of runs/ counted."""
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for path in (ROOT / "runs").rglob("*.py"):
        if "migrations" in path.parts:
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        source = domain_of(module)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = ([f"runs.{alias.name}" for alias in node.names] if node.module == "runs" else [node.module])
            else:
                continue
            for name in names:
                target = domain_of(name)
                if source and target and target != source:
                    edges[(source, target)].add(str(path.relative_to(ROOT)))
    return edges


def back_imports(edges) -> dict[tuple[str, str], set[str]]:
    return {pair: files for pair, files in edges.items() if FLOOR[pair[1]] >= FLOOR[pair[0]]}


def test_every_domain_of_runs_has_a_floor():
    assert {a for pair in domain_imports() for a in pair} - set(FLOOR) == set()


def test_no_new_import_runs_back_up():
    new = {f"{a} -> {b}": sorted(files) for (a, b), files in back_imports(domain_imports()).items()
           if (a, b) not in BACK_IMPORTS}
    assert new == {}, ("import from a lower floor only (FLOORS), or send a signal the lower domain declares; "
                       "a model comes from its own domain (runs.pipeline.models ...), never from runs.models")


def test_the_list_of_back_imports_only_shrinks():
    gone = BACK_IMPORTS - set(back_imports(domain_imports()))
    assert gone == set(), f"these no longer import back up: take them off BACK_IMPORTS: {sorted(gone)}"


if __name__ == "__main__":
    edges = domain_imports()
    back = back_imports(edges)
    json.dump({"domain_imports": len(edges), "back_imports": len(back),
               "back_to_the_models_aggregator": sum(1 for _, b in back if b == "models"),
               "back": sorted(f"{a} -> {b}" for a, b in back)}, sys.stdout, indent=1)
    print()
