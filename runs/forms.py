from __future__ import annotations

from django import forms

from runs.run_config import RunConfig, RunConfigError, parse_layer_ids


class LaunchForm(forms.Form):
    name = forms.CharField(max_length=200, required=False, help_text="Optional; shown in the runs list.")
    target_path = forms.CharField(
        max_length=1000, label="Target model directory",
        help_text="A Hugging Face model directory (config.json, weights, tokenizer) under the data roots.",
    )
    dataset_path = forms.CharField(
        max_length=1000, label="Chat dataset (JSONL)",
        help_text="ShareGPT `conversations` or OpenAI-style `messages`, one conversation per line.",
    )
    layer_ids = forms.CharField(
        max_length=200, required=False, label="Layer ids",
        help_text="Hidden-state indices to capture (0 = embeddings). The final hidden state N is "
        "always added last. Empty: EAGLE-3's default [2, N//2, N-3] + N.",
    )
    max_seq_len = forms.IntegerField(min_value=16, max_value=131072, initial=512)
    max_samples = forms.IntegerField(min_value=2, required=False, help_text="Empty: every conversation.")
    draft_vocab_size = forms.IntegerField(min_value=2, max_value=1_000_000, initial=1024)
    epochs = forms.IntegerField(min_value=1, max_value=1000, initial=2)
    lr = forms.FloatField(min_value=1e-7, max_value=0.5, initial=3e-4, label="Learning rate")
    ttt_steps = forms.IntegerField(min_value=1, max_value=10, initial=3, label="TTT steps")

    def clean_layer_ids(self) -> list[int]:
        try:
            return parse_layer_ids(self.cleaned_data.get("layer_ids") or "")
        except RunConfigError as exc:
            raise forms.ValidationError(str(exc)) from None

    def run_config(self) -> RunConfig:
        data = self.cleaned_data
        return RunConfig(
            layer_ids=data["layer_ids"],
            max_seq_len=data["max_seq_len"],
            max_samples=data.get("max_samples"),
            draft_vocab_size=data["draft_vocab_size"],
            epochs=data["epochs"],
            lr=data["lr"],
            ttt_steps=data["ttt_steps"],
        )
