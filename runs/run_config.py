"""The knobs of one pipeline run, validated the same way for the form, the CLI and the API."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from workers.stages.errors import InputError


class RunConfigError(InputError):
    pass


@dataclass(frozen=True)
class RunConfig:
    layer_ids: list[int] = field(default_factory=list)  # empty: EAGLE-3 default of the target
    max_seq_len: int = 512
    max_samples: int | None = None
    draft_vocab_size: int = 1024
    epochs: int = 2
    lr: float = 3e-4
    ttt_steps: int = 3
    val_fraction: float = 0.1  # share of rows held out, whole conversations at a time
    seed: int = 0  # the train/validation split and the draft's initialisation
    max_tokens_per_step: int | None = None  # packing budget; raised to the longest row; None: 512 or the longest
    eval_prompts: int = 32  # held-out conversations decoded to measure acceptance
    eval_max_new_tokens: int = 64

    def __post_init__(self) -> None:
        checks = [
            (self.max_seq_len >= 16, f"max_seq_len must be at least 16, got {self.max_seq_len}"),
            (self.max_samples is None or self.max_samples >= 2, f"max_samples must be at least 2, got {self.max_samples}"),
            (self.draft_vocab_size >= 2, f"draft_vocab_size must be at least 2, got {self.draft_vocab_size}"),
            (1 <= self.epochs <= 1000, f"epochs must be between 1 and 1000, got {self.epochs}"),
            (0 < self.lr < 1, f"lr must be between 0 and 1, got {self.lr}"),
            (1 <= self.ttt_steps <= 10, f"ttt_steps must be between 1 and 10, got {self.ttt_steps}"),
            (0 < self.val_fraction < 0.5, f"val_fraction must be between 0 and 0.5, got {self.val_fraction}"),
            (0 <= self.seed < 2**32, f"seed must be between 0 and 2**32 - 1, got {self.seed}"),
            (self.max_tokens_per_step is None or 16 <= self.max_tokens_per_step <= 1_048_576,
             f"max_tokens_per_step must be between 16 and 1048576, got {self.max_tokens_per_step}"),
            (1 <= self.eval_prompts <= 1000, f"eval_prompts must be between 1 and 1000, got {self.eval_prompts}"),
            (1 <= self.eval_max_new_tokens <= 4096,
             f"eval_max_new_tokens must be between 1 and 4096, got {self.eval_max_new_tokens}"),
        ]
        for ok, message in checks:
            if not ok:
                raise RunConfigError(message)

    def as_dict(self) -> dict:
        return asdict(self)


def parse_layer_ids(text: str) -> list[int]:
    """'2, 4,5' -> [2, 4, 5]; empty text -> [] (use the target's default)."""
    parts = [p.strip() for p in text.replace(" ", ",").split(",") if p.strip()]
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise RunConfigError(f"layer ids must be integers separated by commas, got {text!r}") from None
