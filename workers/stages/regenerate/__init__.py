"""Regenerate stage: a chat dataset's assistant replies written again by the target, as speculators 0.9's
`speculators regenerate-responses` makes on-policy data, in the source's own format. Its settings, result and
errors are in base, the stage in stage, the shards' merge in merge, the target's check in target.

Importing those loads no torch (the backends load it when they run): the web tier may check a target with
target.regenerate_check_target."""
