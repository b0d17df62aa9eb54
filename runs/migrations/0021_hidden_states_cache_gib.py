"""The online cache's setting is named for what it counts: hidden_states_cache_gb (which always counted
GiB, 2**30 bytes) becomes hidden_states_cache_gib in every stored config: runs' settings, sweeps' base
settings, and saved views' setting filters. The values are unchanged, being in GiB already."""
import re

from django.db import migrations

OLD, NEW = "hidden_states_cache_gb", "hidden_states_cache_gib"


def _renamed(mapping: dict, old: str, new: str) -> dict | None:
    """mapping with the key old renamed new (keeping the order), or None when it has no old key."""
    if not isinstance(mapping, dict) or old not in mapping:
        return None
    return {(new if key == old else key): value for key, value in mapping.items()}


def _rename(apps, old: str, new: str) -> None:
    PipelineRun = apps.get_model("runs", "PipelineRun")
    for run in PipelineRun.objects.filter(config__has_key=old).only("pk", "config"):
        run.config = _renamed(run.config, old, new)
        run.save(update_fields=["config"])
    Sweep = apps.get_model("runs", "Sweep")
    for sweep in Sweep.objects.filter(base__config__has_key=old).only("pk", "base"):
        sweep.base = {**sweep.base, "config": _renamed(sweep.base["config"], old, new)}
        sweep.save(update_fields=["base"])
    SavedView = apps.get_model("runs", "SavedView")
    typed = re.compile(rf"(^|;)(\s*){re.escape(old)}(\s*=)")
    for view in SavedView.objects.all().only("pk", "params"):
        params = _renamed(view.params, f"setting.{old}", f"setting.{new}") or dict(view.params or {})
        if isinstance(params.get("settings"), str):
            params["settings"] = typed.sub(rf"\g<1>\g<2>{new}\g<3>", params["settings"])
        if params != view.params:
            view.params = params
            view.save(update_fields=["params"])


def forward(apps, schema_editor):
    _rename(apps, OLD, NEW)


def backward(apps, schema_editor):
    _rename(apps, NEW, OLD)


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0020_alert_rule_site_url"),
    ]

    operations = [migrations.RunPython(forward, backward)]
