"""The backend registry on this host, with GPUs or without (speculators installed; vLLM where `make vllm` ran): what
it can run, why not the rest, and that the web tier can import the registry without torch."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from workers.contract.host import backends
from workers.stages.extract import with_transformers as extract_module
from workers.contract.host.backends import (
    BACKENDS_BY_NAME,
    BackendUnavailable,
    backend_require,
    host_capabilities,
    host_queues,
)

ROOT = Path(__file__).resolve().parents[2]


def torch_gpus() -> list[dict]:
    """The CUDA devices torch sees in this process: none on the development machines, some on GPU hosts."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [{"name": torch.cuda.get_device_name(i), "memory_bytes": torch.cuda.get_device_properties(i).total_memory}
            for i in range(torch.cuda.device_count())]


def test_this_host_reports_the_gpus_torch_sees_and_what_each_backend_can_do_with_them():
    caps = host_capabilities()
    gpus = torch_gpus()
    have = len(gpus)
    assert caps["gpus"] == gpus
    assert caps["backends"]["transformers"] is None and caps["backends"]["eagle3web"] is None
    assert caps["backends"]["speculators"] == (None if have else "needs a GPU; this host has none")
    spread = have if have and importlib.util.find_spec("accelerate") else 1
    assert caps["max_gpus"] == {"transformers": spread, "vllm": caps["max_gpus"]["vllm"], "eagle3web": 1,
                                "speculators": have}
    assert caps["versions"]["speculators"] == "0.9.0" and caps["versions"]["torch"].startswith("2.13.0")
    assert BACKENDS_BY_NAME["eagle3web"].probe(2).startswith("trains on one device")


def test_a_host_without_gpus_runs_the_default_backends_on_its_cpu_and_says_why_not_the_others(monkeypatch):
    # This machine as the development hosts are; FAKE on a GPU host, whose GPUs are hidden here.
    monkeypatch.setattr(backends, "detect_gpus", lambda: ())
    caps = host_capabilities()
    assert caps["gpus"] == []
    assert caps["backends"]["transformers"] is None and caps["backends"]["eagle3web"] is None
    assert caps["backends"]["speculators"] == "needs a GPU; this host has none"
    assert caps["max_gpus"] == {"transformers": 1, "vllm": caps["max_gpus"]["vllm"], "eagle3web": 1, "speculators": 0}
    assert BACKENDS_BY_NAME["transformers"].probe(2) == "needs a GPU; this host has none"


def test_vllm_counts_where_its_cpu_build_is_installed_and_says_why_where_it_is_not(monkeypatch, tmp_path):
    from workers.contract.host import vllm_env

    install = vllm_env.vllm_install()
    caps = host_capabilities()
    if isinstance(install, str):
        assert caps["backends"]["vllm"] == install and caps["vllm"] is None
    else:
        # `make vllm` here installs the CPU build, which serves on one "device" whatever GPUs there are.
        assert caps["vllm"] == install.as_dict() and caps["versions"]["vllm"] == install.version
        assert caps["backends"]["vllm"] is None
        assert caps["max_gpus"]["vllm"] == (1 if install.is_cpu else len(caps["gpus"]))
        if install.is_cpu:
            assert "vllm.1" in host_queues(caps)
    monkeypatch.setenv("EAGLE3WEB_VLLM", str(tmp_path / "no-vllm"))
    assert BACKENDS_BY_NAME["vllm"].probe(1).startswith("vllm is not installed (`make vllm` installs it")
    fake = tmp_path / "vllm"
    fake.write_text(f"#!{sys.executable}\n")  # a Python without the vllm package
    fake.chmod(0o755)
    monkeypatch.setenv("EAGLE3WEB_VLLM", str(fake))
    assert BACKENDS_BY_NAME["vllm"].probe(1) == f"{fake} is not a working vLLM install (its Python finds no vllm package)"


def test_a_stage_this_host_cannot_run_is_refused_naming_backend_and_reason():
    backend_require(name="transformers", gpus=1)
    have = len(torch_gpus())
    asked = have + 1  # one GPU more than this host has
    why = "needs a GPU; this host has none" if not have else f"needs {asked} GPUs; this host has {have}"
    with pytest.raises(BackendUnavailable, match=rf"^speculators' trainer \(torchrun\) \(speculators\) on {asked} "
                                                 rf"GPU\(s\) cannot run on .*: {why}$"):
        backend_require(name="speculators", gpus=asked)
    with pytest.raises(BackendUnavailable, match="unknown backend 'tensorrt'"):
        backend_require(name="tensorrt", gpus=1)
    # A GPU count a config edited after launch can hold (runs.pipeline.dispatch.routing reads a bad one as 0).
    with pytest.raises(BackendUnavailable, match=r"^Transformers \(transformers\) needs a GPU count from 1 to 64, got 0$"):
        backend_require(name="transformers", gpus=0)


def test_extract_on_several_gpus_refuses_a_host_without_them_before_loading_the_model(tmp_path, monkeypatch,
                                                                                       tiny_target):
    from workers.stages.prepare.stage import prepare

    prepared = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
                       out_dir=tmp_path / "prepared", max_seq_len=128, max_samples=4)
    monkeypatch.setattr(extract_module, "load_target", lambda *a, **k: pytest.fail("model loaded"))
    have = len(torch_gpus())
    asked = max(2, have + 1)
    with pytest.raises(ValueError, match=f"num_gpus={asked}: spreading the target needs {asked} CUDA devices; "
                                         f"this worker has {have}"):
        extract_module.extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir,
                               out_dir=tmp_path / "extraction", layer_ids=[2, 4, 5, 8], num_gpus=asked)


def test_the_registry_and_its_json_probe_import_no_torch_in_the_caller():
    script = ("import sys, workers.contract.host.backends as b; "
              "q = b.stage_queue(backend='vllm', gpus=2); caps = b.host_capabilities_isolated(); "
              "print(q, 'torch' in sys.modules, len(caps['gpus']))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         check=True).stdout.split()
    assert out == ["vllm.2", "False", str(len(torch_gpus()))]
    printed = subprocess.run([sys.executable, "-m", "workers.contract.host.backends"], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, check=True).stdout
    assert json.loads(printed)["backends"]["transformers"] is None
