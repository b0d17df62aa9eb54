"""What an online run asks for, and the supply figures its training reports back."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

GIB = 1024**3


@dataclass(frozen=True)
class OnlineSource:
    """Where an online training gets its hidden states.

    capture_servers: `vllm serve` capture servers the train stage starts on its own worker (0 when
    capture_urls name running ones); capture_urls: base URLs (http://host:port) of capture servers
    already running, whose hidden-states files this worker can read (a shared filesystem: vLLM
    writes each sample where its connector's shared_storage_path says, which must be under
    capture_staging_dir); capture_allowed_hosts: the capture host rule's list
    (EAGLE3WEB_CAPTURE_ALLOWED_HOSTS), checked again when the URLs are used; capture_staging_dir: the
    only folder a URL server's files are taken from; cache_dir: the run's cache folder; cache_bytes: its
    size limit; vllm_executable: the `vllm` the started servers run."""

    cache_dir: Path
    cache_bytes: int
    capture_servers: int = 1
    capture_urls: tuple[str, ...] = ()
    vllm_executable: str = "vllm"
    capture_allowed_hosts: tuple[str, ...] = ()
    capture_staging_dir: Path | None = None

    @classmethod
    def from_gib(cls, *, cache_dir: Path, cache_gib: float, capture_servers: int = 1,
                 capture_urls: tuple[str, ...] | list[str] = (), vllm_executable: str = "vllm",
                 capture_allowed_hosts: tuple[str, ...] | list[str] = (),
                 capture_staging_dir: Path | None = None) -> "OnlineSource":
        return cls(cache_dir=Path(cache_dir), cache_bytes=int(cache_gib * GIB), capture_servers=capture_servers,
                   capture_urls=tuple(capture_urls), vllm_executable=vllm_executable,
                   capture_allowed_hosts=tuple(capture_allowed_hosts), capture_staging_dir=capture_staging_dir)


@dataclass
class SupplyReport:
    """The supply side of a training, as TrainResult.supply carries it (asdict) and the run page shows.

    hidden_states: "offline" or "online"; fetch_wait_fraction: the share of the training's step
    time the trainer waited for a sample that was neither cached nor fetched ahead; capture_tokens_per_s:
    tokens the capture servers delivered per second of capture (all servers together); cache_hit_rate:
    samples read from the cache over samples read, per epoch; peak_cache_bytes: the most the cache
    held and set aside (for files being written) at once, which bounds the cache folder's size on disk; served_by:
    samples each server captured; bound: "supply" or "compute"; advice: what the measured rates imply, in words."""

    hidden_states: str = "offline"
    fetch_wait_fraction: float = 0.0
    fetch_wait_seconds: float = 0.0
    capture_tokens_per_s: float | None = None
    capture_tokens: int = 0
    capture_seconds: float = 0.0
    cache_hit_rate_per_epoch: list = field(default_factory=list)
    peak_cache_bytes: int = 0
    cache_limit_bytes: int = 0
    evictions: int = 0
    served_by: dict = field(default_factory=dict)
    retried: int = 0
    servers_startup_seconds: float = 0.0  # until every capture server answered (started ones: vLLM's start)
    bound: str = "compute"
    advice: str = ""

    def as_dict(self) -> dict:
        return asdict(self)
