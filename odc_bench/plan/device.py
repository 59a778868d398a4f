"""Facts about the devices a run's ranks get: which device type, what its calibrations are
filed under, and how much memory a rank may use.

torch is imported only where a real device is asked about: a simulated run never needs it.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from odc_bench.balancers.cost import device_tag
from odc_bench.config.backend import GpuHardwareConfig, SimBackendConfig
from odc_bench.config.fields import require
from odc_bench.config.run import RunConfig
from odc_bench.files import nearest_existing
from odc_bench.sizes import host_available_bytes


def cuda_available() -> bool:
    """Whether this machine sees a CUDA device."""
    import torch

    return torch.cuda.is_available()


def visible_gpus() -> int:
    """How many CUDA devices this process sees."""
    import torch

    return torch.cuda.device_count()


def gpus_without_peer_access(count: int) -> list[tuple[int, int]]:
    """The pairs (i, j) of this host's first `count` GPUs where GPU i cannot reach GPU j's memory."""
    import torch

    return [(i, j) for i in range(count) for j in range(count)
            if i != j and not torch.cuda.can_device_access_peer(i, j)]


def _link_folders_split() -> list[str]:
    """The library folders torch's C++ build writes on the linker's command line unquoted, where
    the command line splits them: torch up to 2.13 at least (pytorch/pytorch PR 191010). Read
    from torch's own builder, not its version, so a torch that quotes them passes; a builder this
    torch lacks (its internals moved) is taken as sound."""
    try:
        from torch._inductor.cpp_builder import CppBuilder, CppTorchOptions

        options = CppTorchOptions()
        command = CppBuilder("probe", ["probe.cpp"], options, output_dir="probe").get_command_line()
        folders = options.get_libraries_dirs()
    except (ImportError, AttributeError, TypeError):
        return []
    words = shlex.split(command)
    return [folder for folder in folders if f"-L{folder}" not in words]


def cpu_compile_problem() -> tuple[str, str] | None:
    """Why torch.compile cannot build and load code for CPU here (Inductor's C++), and what to
    do, or None: a torch or Python installed under a folder with a space cannot link (the
    folders are split); a cache folder on a file system mounted noexec (a hardened /tmp) cannot
    load what was built ("failed to map segment from shared object")."""
    split = _link_folders_split()
    if split:
        return (f"torch.compile's C++ build hands the linker {split[0]!r} unquoted, split at its space "
                f"(pytorch/pytorch PR 191010), and cannot link",
                "install Python and torch under folders without spaces (make setup puts .venv in the clone: clone "
                "the project to such a folder)")
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    if os.statvfs(nearest_existing(Path(cache).absolute())).f_flag & os.ST_NOEXEC:
        return (f"torch.compile loads the code it builds from {cache}, on a file system mounted noexec, which "
                f"refuses to load it",
                "set TORCHINDUCTOR_CACHE_DIR (or TMPDIR) to a folder on one that is not")
    return None


def ranks_per_gpu(world_size: int, gpus: int) -> int:
    """How many of a run's ranks on this host share each GPU: run/worker.py deals rank r the GPU
    r mod gpus."""
    return -(-world_size // max(gpus, 1))


def device_type_of(config: RunConfig) -> str:
    """cpu or cuda, as device=auto|cpu|cuda and this machine decide; ConfigError for cuda without one."""
    if config.device == "cpu":
        return "cpu"
    available = cuda_available()
    require(config.device != "cuda" or available, "device=cuda but no CUDA device is visible; use device=auto or "
                                                  "device=cpu")
    return "cuda" if available else "cpu"


def run_device(config: RunConfig, remote_cuda: bool) -> tuple[str, bool]:
    """The device type a run is resolved for, and whether its ranks run on CUDA devices of other
    hosts (`remote_cuda`: a SLURM job asking for GPUs, submitted from a machine that has none)."""
    remote = remote_cuda and not config.simulated and config.device != "cpu" and not cuda_available()
    return ("cpu" if config.simulated else "cuda" if remote else device_type_of(config)), remote


def hardware_tag(device_type: str) -> str:
    """The name calibrations of this machine's device are filed under."""
    if device_type != "cuda":
        return device_tag(device_type)
    import torch

    return device_tag(device_type, torch.cuda.get_device_name(0))


def memory_limit(config: RunConfig, device_type: str) -> int | None:
    """Bytes a rank may use: a simulated GPU's memory, a local CUDA device's, or this host's
    available memory shared by the run's ranks; None where nothing bounds it (the CPU profile)."""
    if isinstance(config.backend, SimBackendConfig):
        hw = config.backend.hardware
        return int(hw.memory_gb * 1e9) if isinstance(hw, GpuHardwareConfig) else None
    if device_type == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[1])
    return host_available_bytes() // config.world_size
