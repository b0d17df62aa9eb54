"""A sharded regeneration's parts put together (issue 36): what one worker would have written.

Each shard (regenerate with `rows`) wrote its conversations, in file order, to its own file in its own
folder, with a failures file and the meta beside it. Contiguous shards in shard order are the file
order, so the output is their files concatenated byte for byte, and the failures file theirs; the
counts are read back from the merged lines, as a resumed attempt counts them (resume.OutputFiles.load).
Written to a temporary name and renamed, so the output appears whole or not at all, and merging again
(a merge killed before its record was saved) writes the same file.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from workers.stages.regenerate.base import RegenerateError, RegenerateResult, Tally
from workers.stages.regenerate.resume import OutputFiles, _fsync_dir

log = logging.getLogger(__name__)


def _concatenate(sources: list[Path], out: Path) -> None:
    tmp = out.with_name(out.name + ".merging")
    with open(tmp, "wb") as dst:
        for source in sources:
            if source.is_file():  # a shard that failed none of its conversations may have no failures file
                with open(source, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, out)


def _tally(files: OutputFiles) -> Tally:
    tally = Tally()
    with open(files.out, "rb") as fh:
        for line in fh:
            tally.add_written(json.loads(line)["regenerated"])
    if files.failures.is_file():
        with open(files.failures, "rb") as fh:
            for line in fh:
                tally.add_failure(json.loads(line))
    return tally


def regenerate_merge(*, parts: list[RegenerateResult], out_path: Path) -> RegenerateResult:
    """Write `out_path` (and its failures and meta files) from the shards' results, given in shard
    order, and return the regeneration's result as one worker would have.

    `seconds` is the longest shard's (they ran at the same time) and `tokens_per_s` every shard's new
    tokens over it; `resumed_from` counts the conversations earlier attempts of every shard had written."""
    if not parts:
        raise RegenerateError("no shards to merge")
    out_path = Path(out_path)
    parts = [p if isinstance(p, RegenerateResult) else RegenerateResult(**p) for p in parts]
    for field in ("source_sha256", "backend", "max_model_len", "skipped_excluded"):
        values = {getattr(p, field) for p in parts}
        if len(values) > 1:
            raise RegenerateError(f"the shards disagree on {field} ({sorted(map(str, values))}): they regenerated "
                                  "different sources or settings; retry the regeneration")
    part_files = [OutputFiles(Path(p.out_path)) for p in parts]
    for files in part_files:
        if not files.out.is_file():
            raise RegenerateError(f"{files.out}: a shard's part is not there; retry the shards that did not finish")
    merged = OutputFiles(out_path)
    identity = part_files[0].meta.read_text(encoding="utf-8")
    if out_path.exists() and (not merged.meta.is_file() or merged.meta.read_text(encoding="utf-8") != identity):
        raise RegenerateError(f"{out_path} exists and was not written by this regeneration (another source, "
                              "target or settings); remove it or write elsewhere")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = merged.meta.with_name(merged.meta.name + ".tmp")
    tmp.write_text(identity, encoding="utf-8")
    os.replace(tmp, merged.meta)
    _concatenate([f.failures for f in part_files], merged.failures)
    _concatenate([f.out for f in part_files], merged.out)
    _fsync_dir(out_path.parent)
    tally = _tally(merged)
    if not tally.conversations:
        raise RegenerateError(f"none of the {tally.failures} conversations could be answered, e.g. "
                              f"{tally.failure_examples[:3]}; see {merged.failures}")
    seconds = max(p.seconds for p in parts)
    new_tokens = sum(p.tokens_per_s * p.seconds for p in parts)
    first = parts[0]
    result = RegenerateResult(
        out_path=str(out_path), source_sha256=first.source_sha256, backend=first.backend,
        backend_version=", ".join(sorted({p.backend_version for p in parts if p.backend_version})),
        conversations=tally.conversations, turns_regenerated=tally.turns, replies_cut=tally.cut,
        failures=tally.failures, failure_examples=tally.failure_examples, skipped_excluded=first.skipped_excluded,
        resumed_from=sum(p.resumed_from for p in parts), generated_tokens=tally.tokens, seconds=seconds,
        tokens_per_s=round(new_tokens) / seconds if seconds else 0.0, failures_path=str(merged.failures),
        max_model_len=first.max_model_len)
    log.info("merged %d shards into %s: %d conversations, %d failed", len(parts), out_path, result.conversations,
             result.failures)
    return result
