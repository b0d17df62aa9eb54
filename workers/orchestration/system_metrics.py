"""What a worker's machine is doing: CPU, memory, GPU and disk, sampled with psutil and NVML.

Two readers of the same sample:
- StageSampler, a thread stage_execute (workers/orchestration/tasks.py) runs beside a run's stage: every
  EAGLE3WEB_SYSTEM_SAMPLE_SECONDS it samples the stage's process and its children (a trainer or vLLM it
  started) and writes the sample as points of the run's "system/..." series
  (runs.tracking.services.system_samples_record), which the run page charts against wall time.
- the worker's heartbeat (workers/orchestration/fleet.py), which samples the whole worker (its main process and pool)
  and puts the sample on its row, for the workers page.

A figure that cannot be read is left out, never written as 0: no GPU (or no NVML and no CUDA torch in
the process) means no GPU figures at all, and the rates (CPU, disk) need two reads, so the first sample
has none.

GPUs come from NVML (the nvidia-ml-py package: vLLM's image has it; `pip install nvidia-ml-py`
elsewhere), numbered as the process sees them (CUDA_VISIBLE_DEVICES applies), device-wide figures. Without
NVML, a process whose torch already initialised CUDA (a stage on a GPU) reports the memory its torch
holds per device and no utilisation; CUDA is never initialised here: a forked pool's stages need it not to be.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time

import psutil
from django.conf import settings
from django.db import close_old_connections, connection

logger = logging.getLogger(__name__)

_DISK_COUNTERS = hasattr(psutil.Process, "io_counters")  # not on macOS


class ProcessTreeMeter:
    """CPU, RSS and disk I/O of a process and its descendants, and of the host; rates since the last read.

    CPU and disk are summed per process between reads: a process seen at both reads adds what it did
    since the first, one new since then adds all it did, one that ended is no longer counted (its
    parent's children_* times would bring back its whole life at once, a spike, so they are not read)."""

    def __init__(self, pid: int | None = None):
        self.root = psutil.Process(pid)
        self.cpu_count = psutil.cpu_count() or 1
        self._last_wall: float | None = None
        self._last_mono = 0.0
        self._seen: dict[tuple[int, float], tuple[float, int, int]] = {}  # (pid, created) -> cpu s, read B, written B
        self._host_cpu: tuple[float, float] | None = None  # busy, total seconds over all CPUs

    def _tree(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def read(self) -> dict:
        wall, mono = time.time(), time.monotonic()
        seen: dict[tuple[int, float], tuple[float, int, int]] = {}
        rss = cpu = read = written = 0
        for proc in self._tree():
            try:
                with proc.oneshot():
                    key = (proc.pid, proc.create_time())
                    times = proc.cpu_times()
                    rss += proc.memory_info().rss
                    io = proc.io_counters() if _DISK_COUNTERS else None
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
            now = (times.user + times.system, io.read_bytes if io else 0, io.write_bytes if io else 0)
            seen[key] = now
            before = self._seen.get(key)
            if before is None and self._last_wall is not None:
                # Not there at the last read, so born since (its create_time, whole seconds from boot, cannot
                # tell): all it did falls in this interval.
                before = (0.0, 0, 0)
            if before is not None:
                cpu += max(0.0, now[0] - before[0])
                read += max(0, now[1] - before[1])
                written += max(0, now[2] - before[2])
        memory = psutil.virtual_memory()
        sample = {"time": wall, "cpu_count": self.cpu_count, "rss_bytes": rss,
                  # What programs hold: total minus what the kernel could hand out now (caches are not "used").
                  "host_memory_used_bytes": memory.total - memory.available, "host_memory_total_bytes": memory.total}
        host = psutil.cpu_times()
        idle = host.idle + getattr(host, "iowait", 0.0)
        host_now = (sum(host) - idle, sum(host))
        if self._last_wall is not None and seen:
            elapsed = max(mono - self._last_mono, 1e-3)
            sample["cpu_percent"] = min(100.0 * cpu / elapsed, 100.0 * self.cpu_count)
            if _DISK_COUNTERS:
                sample["disk_read_bytes_per_s"] = read / elapsed
                sample["disk_write_bytes_per_s"] = written / elapsed
            busy, total = host_now[0] - self._host_cpu[0], host_now[1] - self._host_cpu[1]
            if total > 0:
                sample["host_cpu_percent"] = min(100.0, max(0.0, 100.0 * busy / total))
        self._seen, self._last_wall, self._last_mono, self._host_cpu = seen, wall, mono, host_now
        return sample


def _visible(count: int, handle_by_uuid) -> list:
    """NVML's handles of the GPUs this process sees, in CUDA's order (CUDA_VISIBLE_DEVICES: indices or UUIDs)."""
    import pynvml

    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    handles = []
    for item in (part.strip() for part in listed.split(",")):
        if item.isdigit() and int(item) < count:
            handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(item)))
        elif item.startswith(("GPU-", "MIG-")):
            handles.append(handle_by_uuid(item))
        else:
            break  # CUDA stops at the first entry it cannot use ("-1", "" or a bad index): so do we
    return handles


def _imported(name: str):
    """The module if this process has imported it in full; None while it is absent or still being imported.

    A stage imports torch in the task's thread while the sampler reads in its own: a fresh worker's first
    stage put a half-initialised torch in sys.modules for seconds, and reading `torch.cuda` from it raised
    "partially initialized module 'torch' has no attribute 'cuda'". The import machinery marks a module
    being executed with its spec's `_initializing` (what CPython's own "partially initialized" error
    checks); until then its stage cannot have initialised CUDA, so there is nothing of it to read."""
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


class GpuMeter:
    """Utilisation and memory of each GPU this process sees; [] where it sees none."""

    def __init__(self):
        self._nvml: list | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = _visible(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetHandleByUUID)
        except Exception:  # noqa: BLE001 - no nvidia-ml-py, no driver or no GPU: the torch figures, or none
            self._nvml = None

    def read(self) -> list[dict]:
        if self._nvml is not None:
            return self._read_nvml()
        torch = _imported("torch")
        if torch is None or not torch.cuda.is_initialized():
            return []
        # Reading a device's allocator initialises nothing; the device-wide figures would (a context per GPU).
        return [{"index": i, "memory_used_bytes": int(torch.cuda.memory_reserved(i))}
                for i in range(torch.cuda.device_count())]

    def _read_nvml(self) -> list[dict]:
        import pynvml

        gpus = []
        for index, handle in enumerate(self._nvml):
            gpu: dict = {"index": index}
            try:
                gpu["util_percent"] = float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
            except pynvml.NVMLError:
                pass  # e.g. a MIG slice has no utilisation of its own
            try:
                memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
                gpu["memory_used_bytes"], gpu["memory_total_bytes"] = int(memory.used), int(memory.total)
            except pynvml.NVMLError:
                pass
            gpus.append(gpu)
        return gpus


class SystemMeter:
    """One sample of this process's tree, the host and the GPUs it sees (see the module's docstring)."""

    def __init__(self, pid: int | None = None):
        self.tree = ProcessTreeMeter(pid)
        self.gpus = GpuMeter()

    def sample(self) -> dict:
        sample = self.tree.read()
        try:
            gpus = self.gpus.read()
        except Exception:  # noqa: BLE001 - a GPU figure lost is no reason to lose the CPU's
            logger.warning("could not read the GPUs' figures", exc_info=True)
            gpus = []
        if gpus:
            sample["gpus"] = gpus
        return sample


SERIES_FIELDS = ("cpu_percent", "host_cpu_percent", "rss_bytes", "host_memory_used_bytes",
                 "disk_read_bytes_per_s", "disk_write_bytes_per_s")
GPU_SERIES_FIELDS = ("util_percent", "memory_used_bytes")


def series_values(sample: dict) -> dict[str, float]:
    """A sample as the run's series keys (system/cpu_percent, system/gpu0_util_percent, ...): what it holds."""
    values = {f"system/{name}": sample[name] for name in SERIES_FIELDS if name in sample}
    for gpu in sample.get("gpus", []):
        values.update({f"system/gpu{gpu['index']}_{name}": gpu[name] for name in GPU_SERIES_FIELDS if name in gpu})
    return values


class StageSampler(threading.Thread):
    """Samples while a run's stage runs and appends each sample to the run's system series: one at the
    start (memory and GPUs; the rates need a second read), one every EAGLE3WEB_SYSTEM_SAMPLE_SECONDS and
    one at the end, so that a stage of a few seconds still has its points. A write that fails is
    logged and dropped: the stage goes on, and so does sampling."""

    def __init__(self, *, stage_name: str, record_id: int):
        super().__init__(name=f"system-metrics-{stage_name}-{record_id}", daemon=True)
        self.stage_name, self.record_id = stage_name, record_id
        self.stopped = threading.Event()

    def run(self) -> None:
        from runs.tracking.services import system_samples_record
        from runs.tracking.system_series import system_series_owner

        period = max(0.5, float(settings.EAGLE3WEB_SYSTEM_SAMPLE_SECONDS))
        try:
            owner = system_series_owner(stage_name=self.stage_name, record_id=self.record_id)
            if owner is None:
                return  # a checkpoint measured on its own: no run of its own to chart it on
            meter = SystemMeter()

            def write() -> None:
                sample = meter.sample()
                try:
                    system_samples_record(
                        training_run_id=owner, samples=[{"time": sample["time"], "values": series_values(sample)}])
                except Exception:  # noqa: BLE001 - the database away for a while: this sample is lost, not the stage
                    logger.warning("could not write the system sample of %s %s", self.stage_name, self.record_id,
                                   exc_info=True)
                    close_old_connections()

            write()
            last = time.monotonic()
            while not self.stopped.wait(max(0.0, period - (time.monotonic() - last))):
                write()
                last = time.monotonic()
            if time.monotonic() - last >= 0.5:
                write()  # the stage's last stretch
        except Exception:  # noqa: BLE001 - psutil or the database failed at the start: the stage runs on unsampled
            logger.warning("system metrics of %s %s stopped", self.stage_name, self.record_id, exc_info=True)
        finally:
            connection.close()

    def stop(self) -> None:
        """Ends sampling with one last sample; waits for it (a few ms) so it lands before the task returns."""
        self.stopped.set()
        self.join(timeout=10)
