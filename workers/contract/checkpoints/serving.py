"""The `vllm serve` command for a draft checkpoint.

vLLM 0.33 refuses `vllm serve <checkpoint>` when the checkpoint's verifier is a local path ("Speculators
verifier must name a remote model repository"); the form it accepts for local and hub verifiers alike
names the target and passes the draft in `--speculative-config`. Torch-free: pages print it.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from workers.contract.errors import InputError
from workers.contract.inputs.jsonfile import read_json_object

DEFAULT_SPECULATIVE_TOKENS = 3  # speculators' default proposal length for EAGLE-3


class CheckpointConfigError(InputError):
    """A checkpoint's config.json does not say what the serve command needs."""


def checkpoint_speculative_tokens(checkpoint_dir: Path) -> int:
    """How many tokens the draft proposes per step, as its config.json says (speculators'
    `speculators_config.proposal_methods[0].speculative_tokens`)."""
    config = read_json_object(Path(checkpoint_dir) / "config.json", CheckpointConfigError)
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or []
    value = methods[0].get("speculative_tokens") if methods and isinstance(methods[0], dict) else None
    if value is None:
        return DEFAULT_SPECULATIVE_TOKENS
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 64:
        raise CheckpointConfigError(f"{checkpoint_dir}/config.json: speculative_tokens must be an integer from 1 to "
                                    f"64, got {value!r}")
    return value


def checkpoint_recorded_verifier(checkpoint_dir: Path) -> str | None:
    """The verifier a checkpoint's config.json names (`speculators_config.verifier.name_or_path`)."""
    try:
        config = read_json_object(Path(checkpoint_dir) / "config.json", CheckpointConfigError)
    except CheckpointConfigError:
        return None
    name = ((config.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    return name if isinstance(name, str) and name else None


def vllm_serve_command(*, verifier: str, checkpoint_dir: str, num_speculative_tokens: int) -> str:
    spec = {"model": str(checkpoint_dir), "method": "eagle3", "num_speculative_tokens": int(num_speculative_tokens)}
    return f"vllm serve {shlex.quote(str(verifier))} --speculative-config {shlex.quote(json.dumps(spec))}"
