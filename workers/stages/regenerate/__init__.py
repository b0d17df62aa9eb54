"""Regenerate stage: a chat dataset's assistant replies written again by the target, as speculators 0.9's
`speculators regenerate-responses` makes on-policy data, in the source's own format.

Importing the package loads no torch: the web tier checks a target with regenerate_check_target."""
from workers.stages.regenerate.base import (
    RegenerateError,
    RegenerateResult,
    RegenerateSettings,
    RegenerateStopped,
    turn_seed,
)
from workers.stages.regenerate.merge import regenerate_merge
from workers.stages.regenerate.stage import regenerate, regenerate_count_rows
from workers.stages.regenerate.target import regenerate_check_target

__all__ = ["RegenerateError", "RegenerateResult", "RegenerateSettings", "RegenerateStopped", "regenerate",
           "regenerate_check_target", "regenerate_count_rows", "regenerate_merge", "turn_seed"]
