"""The private torch names the CUDA path reads (workers.stages.torch_internals), against the torch we run.

What is checked, and where: the installed torch (requirements.txt's 2.13.0, CI's) has every name, and
each does what the stages rely on (a compile counts, a raised limit holds and its hit is an error);
the CUDA path's modules import against it without a GPU; no other module of workers/ reaches a
private torch name; and the torch versions the requirements and the GPU image name are the ones the
module supports. The GPU image's torch (2.14.0, vLLM 0.33.0's) is not installed here: its names are
not checked by this suite (docs/workers/gpus.md, "Supported torch").
"""
import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workers.stages import torch_internals
from workers.stages.torch_internals import SUPPORTED_TORCH, TorchInternalsMissing, compiled_graph_count, missing_names

REPO = Path(__file__).resolve().parents[2]
CUDA_PATH_MODULES = ("workers.stages.train.step.packed_attention", "workers.stages.train.step.packed_step",
                     "workers.stages.train.step.stepper", "workers.stages.train.loop",
                     "workers.stages.train.processes.in_child",
                     "workers.stages.extract.with_transformers")


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def test_the_installed_torch_is_supported_and_has_every_private_name_the_cuda_path_reads():
    assert _minor(torch.__version__) in SUPPORTED_TORCH
    assert missing_names() == []
    for module in CUDA_PATH_MODULES:
        importlib.import_module(module)


def test_a_torch_without_a_needed_name_is_refused_naming_it_and_the_supported_versions(monkeypatch):
    monkeypatch.setitem(torch_internals.REQUIRED, ("torch._dynamo.config", "no_such_limit"), "a test's name")
    assert missing_names() == ["torch._dynamo.config.no_such_limit"]
    with pytest.raises(TorchInternalsMissing, match=rf"torch {re.escape(torch.__version__)} has no "
                                                    r"torch._dynamo.config.no_such_limit \(a test's name\); .*"
                                                    r"supports torch 2.13, 2.14"):
        torch_internals._read("torch._dynamo.config", "no_such_limit")


def test_a_compile_counts_as_a_graph_and_a_shape_seen_before_does_not():
    def double(x):
        return x * 2 + 1

    compiled = torch.compile(double, backend="eager", dynamic=False)
    before = compiled_graph_count()
    compiled(torch.ones(3))
    compiled(torch.ones(5))
    compiled(torch.ones(3))
    assert compiled_graph_count() - before == 2


RECOMPILE_LIMIT = """
import torch, torch._dynamo
from workers.stages.torch_internals import raise_recompile_limit
torch._dynamo.config.recompile_limit = 2
raise_recompile_limit(3)
f = torch.compile(lambda x: x + 1, backend="eager", dynamic=False)
for n in range(1, 6):
    try:
        f(torch.ones(n))
    except Exception as exc:
        print(n, type(exc).__name__)
        break
else:
    print("no error")
"""


def test_a_raised_recompile_limit_holds_and_going_past_it_is_an_error():
    """In a process of its own (the limit is process-wide): limit 3, the fourth shape fails, where
    torch's default would fall back to running eagerly without a word."""
    out = subprocess.run([sys.executable, "-c", RECOMPILE_LIMIT], cwd=REPO, capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.split() == ["4", "FailOnRecompileLimitHit"]


def _private_torch_uses(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module.startswith("torch._") or node.module.startswith("torch.nn.attention.flex_attention")):
            found.append(f"{path}:{node.lineno} from {node.module}")
        elif isinstance(node, ast.Import):
            found += [f"{path}:{node.lineno} import {a.name}" for a in node.names if a.name.startswith("torch._")]
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and isinstance(node.value, ast.Name)
              and node.value.id == "torch"):
            found.append(f"{path}:{node.lineno} torch.{node.attr}")
    return found


def test_no_module_of_workers_but_torch_internals_reads_a_private_torch_name():
    modules = [p for p in (REPO / "workers").rglob("*.py") if p.name != "torch_internals.py"]
    assert len(modules) > 50
    assert [use for path in modules for use in _private_torch_uses(path)] == []


def test_the_check_above_finds_a_private_name(tmp_path):
    """It can fail: the uses this check would have found in the training path before the module."""
    sample = tmp_path / "sample.py"
    sample.write_text("import torch\nfrom torch._dynamo.utils import counters\n"
                      "from torch.nn.attention.flex_attention import flex_attention\n"
                      "config = torch._dynamo.config\n")
    assert len(_private_torch_uses(sample)) == 3


def test_the_torch_of_the_requirements_and_of_the_gpu_image_are_the_supported_ones():
    pinned = re.search(r"^torch==(\S+)$", (REPO / "constraints.txt").read_text(), re.M).group(1)
    image = re.search(r"pins torch (\d+\.\d+\.\d+)", (REPO / "Dockerfile.gpu").read_text()).group(1)
    assert {_minor(pinned), _minor(image)} <= set(SUPPORTED_TORCH)
    assert _minor(torch.__version__) == _minor(pinned)
