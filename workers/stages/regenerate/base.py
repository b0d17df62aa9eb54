"""What the regenerate stage's parts share: its settings, result, errors and one reply.

Torch-free, so the web tier can import the package to check a target (regenerate_check_target)."""
from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field

from workers.contract.errors import InputError, StopRequested

BACKENDS = ("vllm", "transformers")
MAX_FAILURE_EXAMPLES = 20


class RegenerateError(InputError):
    """The regeneration cannot go on: the target or the source cannot be used, or vLLM died (its log's
    tail is quoted). What an earlier attempt wrote stays in the .partial file for a retry."""


class RegenerateStopped(StopRequested):
    """should_stop() asked the regeneration to end; the conversations written so far are kept."""


class ConversationFailed(Exception):
    """One conversation cannot be answered (no user turn, a prompt longer than the target takes, a
    template that refuses it): it goes to the failures file and the others go on."""


@dataclass(frozen=True)
class RegenerateSettings:
    max_new_tokens: int = 512
    temperature: float = 0.0  # 0 = greedy
    seed: int = 0  # each reply's seed comes from (seed, row id, reply index): order and concurrency do not matter
    max_samples: int | None = None  # the first N conversations of the file that are not excluded
    # Longest prompt plus reply, in tokens; None: the target's max_position_embeddings. Both backends fail a
    # conversation whose prompt plus max_new_tokens passes it, so they fail the same ones.
    max_model_len: int | None = None

    def check(self) -> None:
        def whole(name: str, low: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise RegenerateError(f"{name} must be a whole number of at least {low}, got {value!r}")

        whole("max_new_tokens", 1)
        whole("seed", 0)
        if self.max_samples is not None:
            whole("max_samples", 1)
        if self.max_model_len is not None:
            whole("max_model_len", 2)
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise RegenerateError(f"temperature must be a number of at least 0 (0 is greedy), got {t!r}")

    def identity(self) -> dict:
        """What decides the replies: an earlier attempt's file is resumed only when these are the same
        (max_samples only chooses which conversations, so it may change between attempts)."""
        return {"max_new_tokens": self.max_new_tokens, "temperature": float(self.temperature), "seed": self.seed}


@dataclass(frozen=True)
class RegenerateResult:
    out_path: str  # the finished file
    source_sha256: str  # sha256 of the source file's bytes
    backend: str  # "vllm" | "transformers"
    backend_version: str  # vLLM's version string / transformers.__version__
    conversations: int  # conversations in the output file
    turns_regenerated: int  # assistant replies written by the target
    replies_cut: int  # replies that stopped at max_new_tokens
    failures: int  # conversations not written (the failures file says why)
    failure_examples: list[dict]  # up to 20 {"id", "error"}
    skipped_excluded: int  # conversations skipped because curation excluded them
    resumed_from: int  # conversations an earlier attempt had already written
    generated_tokens: int  # reply tokens written, all attempts
    seconds: float  # this attempt's generation time
    tokens_per_s: float  # reply tokens this attempt wrote / seconds (0 when nothing was generated)
    failures_path: str = ""  # out_path + ".failures.jsonl"
    max_model_len: int = 0  # prompt plus reply limit the replies were generated under

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Reply:
    text: str
    tokens: int  # generated tokens, the end-of-sequence token included when there was one
    cut: bool  # stopped at max_new_tokens before the end-of-sequence token


def turn_seed(seed: int, source_id: str, reply_index: int) -> int:
    """The seed of one reply: the same for the same (seed, row, reply) whatever the order, the
    concurrency or the attempt, so a resumed or reordered run samples the same replies. 31 bits: vLLM
    and torch both take it."""
    digest = hashlib.sha256(f"{seed}\x00{source_id}\x00{reply_index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF


@dataclass
class Tally:
    """Counts over written conversations (from their "regenerated" keys) and failures."""

    conversations: int = 0
    turns: int = 0
    cut: int = 0
    tokens: int = 0
    failures: int = 0
    failure_examples: list[dict] = field(default_factory=list)

    def add_written(self, regenerated: dict) -> None:
        self.conversations += 1
        self.turns += int(regenerated.get("turns", 0))
        self.cut += len(regenerated.get("cut_turns", ()))
        self.tokens += int(regenerated.get("tokens", 0))

    def add_failure(self, entry: dict) -> None:
        self.failures += 1
        if len(self.failure_examples) < MAX_FAILURE_EXAMPLES:
            self.failure_examples.append({"id": entry.get("id"), "error": entry.get("error")})
