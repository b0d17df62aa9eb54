"""What the regenerate stage's tests share: a target that talks, a chat file of every shape, and the
replies a greedy target gives, computed here without the stage's code.

The session's tiny_target (12 training steps) answers every prompt with newlines until max_new_tokens,
so a comparison of its replies would pass whatever the order of turns or the history fed. The target
here trains 150 steps on the same recipe (about 15 s on 2 cores, built once per session and reused by
both test modules): its replies differ from prompt to prompt and most end with its end token.
"""
from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.long_chats import ENGLISH, ODD

TALKER_STEPS = 150
TALKER_CONVERSATIONS = 400
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
LONG_TEXT = "What is the capital of France? Count from 18 to 26. " * 60  # 3,120 characters, ~840 tokens
TOO_LONG_TEXT = LONG_TEXT * 3  # ~2,500 tokens: more than the talker's 2,048 positions


def talking_target(basetemp: Path):
    """DemoAssets of the talker; a second call (another module) reuses the first build."""
    from workers.stages.demo.assets import build_demo_assets

    return build_demo_assets(Path(basetemp) / "regenerate-talker", num_conversations=TALKER_CONVERSATIONS,
                             train_steps=TALKER_STEPS, seed=0)


def write_jsonl(path: Path, rows: list) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def demo_rows(chats_path: Path, n: int, start: int = 0) -> list[dict]:
    return read_jsonl(chats_path)[start:start + n]


def shaped_rows() -> list[dict]:
    """One row of each shape a user's file has: both formats, systems, several turns, runs of assistant
    turns, an assistant turn before any user, a conversation ending on a user turn, two user turns in a
    row, recorded reasoning, odd unicode, a long paste, no "id", an integer id, extra keys."""
    return [
        {"id": "oa-sys", "source": "web", "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "33 - 65 = ?"}, {"role": "assistant", "content": "The answer is -32."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris.", "reasoning_content": "France's capital is Paris."}]},
        {"id": "sg-runs", "meta": {"lang": "en", "n": 3}, "conversations": [
            {"from": "system", "value": "Answer briefly."},
            {"from": "gpt", "value": "Hello! (an assistant turn before any user: dropped)"},
            {"from": "human", "value": "Count from 18 to 26."},
            {"from": "gpt", "value": "18, 19, 20."}, {"from": "gpt", "value": "21, 22, 23, 24, 25, 26."},
            {"from": "human", "value": "What does a dog say?"}]},
        {"id": "oa-two-users", "messages": [
            {"role": "user", "content": "Spell the word cat."}, {"role": "user", "content": "And dog?"},
            {"role": "assistant", "content": "d-o-g", "thinking": "spell it"}]},
        {"id": "sg-odd-✓", "conversations": [
            {"from": "human", "value": " ".join(ODD[:9])}, {"from": "gpt", "value": "🙂"},
            {"from": "human", "value": "Ωμέγα ∑ x² ≤ ∞ — naïve café?"}, {"from": "gpt", "value": "ok"}]},
        {"id": "oa-long", "messages": [{"role": "user", "content": LONG_TEXT + " ".join(ENGLISH)},
                                       {"role": "assistant", "content": "Paris."}]},
        {"conversations": [{"from": "human", "value": "What is the capital of Japan?"},
                           {"from": "gpt", "value": "Tokyo."}]},  # no "id": keyed by its line
        {"id": 7, "messages": [{"role": "user", "content": "Sort these numbers: 8, 71, 2."},
                               {"role": "assistant", "content": "2, 8, 71."}]},
    ]


def source_id(row: dict, index: int) -> str:
    """The row's id as the chats reader names it: its "id", else its 0-based line (no blank lines here)."""
    return str(row["id"]) if "id" in row else str(index)


def turns_of(row: dict) -> list[dict]:
    return row["messages"] if "messages" in row else row["conversations"]


def role_content(turn: dict) -> tuple[str, str]:
    return ROLES[turn.get("from", turn.get("role"))], turn.get("value", turn.get("content"))


class GreedyReference:
    """The target's greedy replies, by plain argmax over full forwards (no cache, no generate())."""

    def __init__(self, target_dir: Path):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32,
                                                          local_files_only=True).eval()
        self.eos = self.tokenizer.eos_token_id

    def reply(self, history: list[dict], max_new_tokens: int) -> tuple[str, int, bool]:
        """(text, tokens, cut) of the greedy reply to `history`."""
        prompt = list(self.tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=True,
                                                         return_dict=True)["input_ids"])
        new: list[int] = []
        with self.torch.no_grad():
            while len(new) < max_new_tokens and (not new or new[-1] != self.eos):
                logits = self.model(self.torch.tensor([prompt + new])).logits[0, -1]
                new.append(int(self.torch.argmax(logits)))
        return self.tokenizer.decode(new, skip_special_tokens=True), len(new), new[-1] != self.eos

    def conversation(self, row: dict, max_new_tokens: int) -> dict:
        """What the stage should write for `row`: turns as (role, content), cut reply indices, tokens."""
        history, written, cut, tokens = [], [], [], 0
        for turn in turns_of(row):
            role, content = role_content(turn)
            if role == "assistant":
                continue
            history.append({"role": role, "content": content})
            written.append((role, content))
            if role == "user":
                text, n, was_cut = self.reply(history, max_new_tokens)
                history.append({"role": "assistant", "content": text})
                if was_cut:
                    cut.append(len(written))
                written.append(("assistant", text))
                tokens += n
        return {"turns": written, "cut_turns": cut, "tokens": tokens}
