"""The backend registry on this host (speculators installed; vLLM where `make vllm` ran): what it can run, why
not the rest, and that the web tier can import the registry without torch."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from workers.stages import extract as extract_module
from workers.stages.backends import (
    BACKENDS_BY_NAME,
    BackendUnavailable,
    backend_require,
    host_capabilities,
    host_queues,
)

ROOT = Path(__file__).resolve().parents[2]


def test_this_cpu_host_runs_the_default_backends_on_the_cpu_and_says_why_not_the_others():
    caps = host_capabilities()
    assert caps["gpus"] == []
    assert caps["backends"]["transformers"] is None and caps["backends"]["eagle3web"] is None
    assert caps["backends"]["speculators"] == "needs a GPU; this host has none"
    assert caps["max_gpus"] == {"transformers": 1, "vllm": caps["max_gpus"]["vllm"], "eagle3web": 1, "speculators": 0}
    assert caps["versions"]["speculators"] == "0.9.0" and caps["versions"]["torch"].startswith("2.13.0")
    assert BACKENDS_BY_NAME["transformers"].probe(2) == "needs a GPU; this host has none"
    assert BACKENDS_BY_NAME["eagle3web"].probe(2).startswith("trains on one device")


def test_vllm_counts_where_its_cpu_build_is_installed_and_says_why_where_it_is_not(monkeypatch, tmp_path):
    from workers.stages import vllm_env

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
    with pytest.raises(BackendUnavailable, match=r"^speculators' trainer \(torchrun\) \(speculators\) on 4 GPU\(s\) "
                                                 r"cannot run on .*: needs a GPU; this host has none$"):
        backend_require(name="speculators", gpus=4)
    with pytest.raises(BackendUnavailable, match="unknown backend 'tensorrt'"):
        backend_require(name="tensorrt", gpus=1)
    # A GPU count a config edited after launch can hold (runs.routing reads a bad one as 0).
    with pytest.raises(BackendUnavailable, match=r"^Transformers \(transformers\) needs a GPU count from 1 to 64, got 0$"):
        backend_require(name="transformers", gpus=0)


def test_extract_on_several_gpus_refuses_a_host_without_them_before_loading_the_model(tmp_path, monkeypatch,
                                                                                       tiny_target):
    from workers.stages.prepare import prepare

    prepared = prepare(tokenizer_dir=tiny_target.target_dir, dataset_path=tiny_target.chats_path,
                       out_dir=tmp_path / "prepared", max_seq_len=128, max_samples=4)
    monkeypatch.setattr(extract_module, "load_target", lambda *a, **k: pytest.fail("model loaded"))
    with pytest.raises(ValueError, match="num_gpus=2: spreading the target needs 2 CUDA devices; this worker has 0"):
        extract_module.extract(target_dir=tiny_target.target_dir, prepared_dir=prepared.out_dir,
                               out_dir=tmp_path / "extraction", layer_ids=[2, 4, 5, 8], num_gpus=2)


def test_the_registry_and_its_json_probe_import_no_torch_in_the_caller():
    script = ("import sys, workers.stages.backends as b; "
              "q = b.stage_queue(backend='vllm', gpus=2); caps = b.host_capabilities_isolated(); "
              "print(q, 'torch' in sys.modules, len(caps['gpus']))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         check=True).stdout.split()
    assert out == ["vllm.2", "False", "0"]
    printed = subprocess.run([sys.executable, "-m", "workers.stages.backends"], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, check=True).stdout
    assert json.loads(printed)["backends"]["transformers"] is None
