"""Views call services and selectors only: the web tier's request handlers (runs/web/views.py,
and the REST API's in runs/api/) import nothing of runs.models and run no queries
of their own; every read goes through a selector (runs/pipeline/selectors.py, a run's status and summary in
runs/pipeline/status/), every write through a service."""
import ast

import pytest

from tests.house.test_import_graph import ROOT, import_graph

VIEW_MODULES = ("runs.web.views", "runs.api.views.runs", "runs.api.views.data", "runs.api.views.docs",
                "runs.api.account.views")


@pytest.mark.parametrize("module", VIEW_MODULES)
def test_views_import_nothing_of_the_models(module):
    imported = import_graph()[module]
    assert sorted(m for m in imported if m == "runs.models" or m.startswith("runs.models.")) == []


@pytest.mark.parametrize("module", VIEW_MODULES)
def test_views_ask_no_manager_and_no_get_object_or_404(module):
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    queries = [f"line {node.lineno}: .objects" for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and node.attr == "objects"]
    shortcuts = [f"line {node.lineno}: {node.id}" for node in ast.walk(tree)
                 if isinstance(node, ast.Name) and node.id in ("get_object_or_404", "get_list_or_404")]
    assert queries + shortcuts == []
