"""TEST-ONLY SEAM: lets speculators' trainer, started by torchrun, run on a host without an accelerator.

Put this folder on PYTHONPATH and set EAGLE3WEB_TEST_CPU_AS_DEVICE=1; Python imports `sitecustomize`
at start-up in torchrun and in every rank. speculators 0.9 has no device option: under torchrun
`maybe_setup_distributed` calls `torch.accelerator.set_device_index(LOCAL_RANK)` and
`init_process_group(backend, device_id=LOCAL_RANK)`, `Trainer.setup_model` and `train_epoch` move
the model and batches with `.to(local_rank)` (an int: accelerator N), the DataLoader pins memory,
`_StepTimer` synchronizes the accelerator, and `main` ends with `empty_cache()`. Each of those
stops on a CPU host with "Cannot access accelerator device when none is available". Here the CPU
stands in for accelerator 0: those calls are mapped to the CPU (int devices -> "cpu", pinning and
synchronizing are no-ops, the process group is gloo without a device id, and
`speculators.utils.util.get_current_device`, where the checkpointer loads a checkpoint to when
resuming, answers "cpu": it would build "cpu:0", a name safetensors and torch.load refuse).
Nothing else changes:
the command line, the data loading, the model, the loss, DDP, the metric records, the checkpoints
and the resume are speculators' own. Never on a worker's path: only tests set the variable.
"""
import os

if os.environ.get("EAGLE3WEB_TEST_CPU_AS_DEVICE") == "1":
    import time

    import torch
    import torch.distributed as _dist

    _CPU = torch.device("cpu")

    def _cpu_for_index(args: tuple) -> tuple:
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            return ("cpu", *args[1:])
        return args

    _module_to, _tensor_to = torch.nn.Module.to, torch.Tensor.to
    torch.nn.Module.to = lambda self, *args, **kwargs: _module_to(self, *_cpu_for_index(args), **kwargs)
    torch.Tensor.to = lambda self, *args, **kwargs: _tensor_to(self, *_cpu_for_index(args), **kwargs)
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
    torch.accelerator.current_accelerator = lambda check_available=False: _CPU
    torch.accelerator.is_available = lambda: False  # what is true; the trainer then skips memory statistics
    torch.accelerator.set_device_index = lambda index: None
    torch.accelerator.current_device_index = lambda: 0
    # A pause per synchronize (several per logged step) slows a test's trainer to a pace a stop can
    # catch between two epochs on a loaded host; 0 (the default) adds nothing.
    _PAUSE = float(os.environ.get("EAGLE3WEB_TEST_SYNC_PAUSE_SECONDS") or 0)

    def _synchronize(device=None):
        if _PAUSE:
            time.sleep(_PAUSE)

    torch.accelerator.synchronize = _synchronize
    if not hasattr(torch.cpu, "empty_cache"):
        torch.cpu.empty_cache = lambda: None

    from speculators.utils import util as _util

    # Bound by name when speculators.train.checkpointer is imported, which happens after this.
    _util.get_current_device = lambda: "cpu"

    _init_process_group = _dist.init_process_group

    def _init_without_device(*args, device_id=None, **kwargs):
        return _init_process_group(*args, **kwargs)  # gloo, which the CPU "accelerator" resolves to

    _dist.init_process_group = _init_without_device
