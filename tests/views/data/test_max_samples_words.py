"""A run's "max samples" counts rows (one per assistant reply, as speculators counts samples) and a
regeneration's counts conversations; the forms said "every conversation" for both. Each form now names
what it counts, and the run form's help says a conversation with several replies gives several rows."""
from __future__ import annotations

import re

import pytest

from runs.data.models import Dataset

pytestmark = pytest.mark.django_db


def _label_and_help(html: str, field: str) -> str:
    """The field's label and help text as the page shows them (what follows its label, up to the next field)."""
    start = html.find(f'for="id_{field}"')
    assert start >= 0, f"no {field} field on the page"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html[start:start + 800].split('<label for="id_', 1)[0]))


def test_the_run_form_counts_rows_and_the_regeneration_form_conversations(client, user, roots):
    client.force_login(user)
    launch = _label_and_help(client.get("/runs/new/").content.decode(), "max_samples")
    assert "Max rows" in launch and "one per assistant reply" in launch and "every conversation" not in launch
    dataset = Dataset.objects.create(path=str(roots / "chats.jsonl"), name="chats.jsonl")
    regenerate = _label_and_help(client.get(f"/datasets/{dataset.pk}/").content.decode(), "max_samples")
    assert "Max conversations" in regenerate and "first N conversations" in regenerate
