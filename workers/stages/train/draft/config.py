"""The config.json a draft's checkpoints will hold, written before any training: for the launch's vLLM check
(runs.pipeline.launch.preflight), which asks vLLM's config classes about it.

speculators' Eagle3SpeculatorConfig, built as `Eagle3DraftModel.from_training_args` builds it with the
arguments workers/stages/train/draft/model.py build_draft_model gives it (speculators' eagle3 defaults), and the
keys a checkpoint's save adds (SingleGPUCheckpointer.save_checkpoint: the model class in `architectures`,
bf16 tensors, untied embeddings), without building the model, whose embeddings would read the target's
weights. tests/services/launch/test_launch_preflight.py compares it with the config.json of a real checkpoint.

Run as `python -m workers.stages.train.draft.config` (from the project root) it reads one JSON request on
stdin, {"target": DIR, "aux_layer_ids": [...], "draft_vocab_size": N, "ttt_steps": k, "out_dir": DIR},
writes out_dir/config.json and prints {"ok": true} or {"ok": false, "error": "..."}: the web tier imports
neither torch nor speculators (tests/views/url_map/test_web_without_torch.py), so a launch runs it as a child.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

DRAFT_LAYER_ARGS = {"num_layers": 1, "draft_arch": "llama", "hidden_act": None, "sliding_window": 2048,
                    "full_attention_indices": []}
DRAFT_NORMS = {"norm_before_residual": True, "norm_before_fc": True, "fc_norm": False, "norm_output": True,
               "embed_requires_grad": False}
SAVED_AS = {"architectures": ["Eagle3DraftModel"], "dtype": "bfloat16", "tie_word_embeddings": False}


def draft_config_write(*, target_dir: Path, aux_layer_ids: list[int], draft_vocab_size: int, ttt_steps: int,
                       out_dir: Path) -> Path:
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from speculators.train.cli import create_transformer_layer_config

    layer_config = create_transformer_layer_config(verifier_name_or_path=str(target_dir), **DRAFT_LAYER_ARGS)
    layer_config._attn_implementation = "eager"  # from_training_args(draft_attn_impl="eager"), as loop.py
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config, draft_vocab_size=draft_vocab_size,
        eagle_aux_hidden_state_layer_ids=list(aux_layer_ids), **DRAFT_NORMS,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=ttt_steps)],
            default_proposal_method="greedy", verifier=VerifierConfig.from_pretrained(str(target_dir))))
    config.save_pretrained(str(out_dir))
    path = Path(out_dir) / "config.json"
    saved = {**json.loads(path.read_text()), **SAVED_AS}
    path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    return path


def main() -> int:
    request = json.loads(sys.stdin.read())
    try:
        draft_config_write(target_dir=Path(request["target"]), aux_layer_ids=request["aux_layer_ids"],
                           draft_vocab_size=request["draft_vocab_size"], ttt_steps=request["ttt_steps"],
                           out_dir=Path(request["out_dir"]))
        answer = {"ok": True}
    except Exception as exc:  # noqa: BLE001 - transformers and speculators raise many kinds; the parent says it
        answer = {"ok": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}"}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
