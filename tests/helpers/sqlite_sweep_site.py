"""A sweep of two runs with validation losses, NaN among them, on whatever database DATABASE_URL names,
and what the sweep's selector answers for each run's val loss (tests/views/sweeps/test_sweep_val_loss.py):

    DATABASE_URL=sqlite:///DB python -m tests.helpers.sqlite_sweep_site ROOT

migrates DB, writes a target and a chat file under ROOT, and prints the sweep's val losses as JSON."""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

# What each run's checkpoints hold: the first a diverged (NaN) validation beside two real ones, the second
# only NaN. The sweep shows the lowest real one, and nothing where there is none.
LOSSES = ({0: math.nan, 1: 1.5, 2: 1.7}, {0: math.nan})
EXPECTED = [1.5, None]


def write_inputs(root: Path) -> tuple[Path, Path]:
    target = root / "target"
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                    "num_hidden_layers": 8, "hidden_size": 64, "vocab_size": 5000}))
    chats = root / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "hello"}]}) + "\n")
    return target, chats


def sweep_val_losses(*, user, target: Path, chats: Path) -> list[float | None]:
    """The sweep built as sweep_launch leaves it (runs launched, not enqueued), its checkpoints registered,
    and the val loss of each of its rows as the sweep page and the API show them."""
    from runs.models import Checkpoint, Sweep, SweepRun
    from runs.pipeline import services
    from runs.pipeline.launch.run_config import RunConfig
    from runs.sweeps.selectors import sweep_rows, sweep_summary

    sweep = Sweep.objects.create(owner=user, name="nan losses", varied=[["seed", ["1", "2"]]])
    for position, losses in enumerate(LOSSES):
        run = services.run_launch(user=user, target_path=target, dataset_path=chats, enqueue=False,
                                  config=RunConfig(draft_vocab_size=64, seed=position + 1))
        SweepRun.objects.create(sweep=sweep, run=run, position=position, values={"seed": str(position + 1)})
        for epoch, loss in losses.items():
            Checkpoint.objects.create(training_run=run.training_run, epoch=epoch, val_loss=loss,
                                      path=f"{run.output_dir}/checkpoints/{epoch}")
    rows, _ = sweep_rows(sweep=sweep)
    summary = sweep_summary(sweep=sweep, rows=(rows, _))
    assert [r["val_loss"] for r in summary["runs"]] == [r.val_loss for r in rows], summary
    return [row.val_loss for row in rows]


def main(root: Path) -> list[float | None]:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_superuser("sweeper", password="pw-sweeper-1")
    target, chats = write_inputs(root)
    return sweep_val_losses(user=user, target=target, chats=chats)


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eagle3web.settings")
    print(json.dumps(main(Path(sys.argv[1]))))
