"""The vLLM the real-vLLM tests run: `make vllm`'s CPU build (or EAGLE3WEB_VLLM). Where it is missing they
skip saying so, unless EAGLE3WEB_REQUIRE_VLLM=1 (CI, after `make vllm`), where they fail."""
from __future__ import annotations

import os

import pytest


def vllm_or_skip():
    """The installed vLLM (workers.contract.host.vllm_env.VllmInstall); skips or fails the test without one."""
    from workers.contract.host.vllm_env import vllm_install

    install = vllm_install()
    if isinstance(install, str):
        if os.environ.get("EAGLE3WEB_REQUIRE_VLLM") == "1":
            pytest.fail(f"EAGLE3WEB_REQUIRE_VLLM=1 but {install}")
        pytest.skip(f"real vLLM is not here: {install}")
    return install
