"""Memory probes of the machine: what a device has free, what this process holds and its peak,
and the PeakMeter that measures the peak of a block of work (CUDA allocator statistics on a GPU,
the resident set's high-water mark on CPU)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

# torch is imported where a CUDA device is probed: planning (every Snakemake invocation) needs
# MiB and the host's probes only.
MiB = 1 << 20


def available_bytes(device: str) -> int:
    """Memory a new allocation can use now: free GPU memory on CUDA; on CPU the host's available
    RAM (psutil if installed, else /proc/meminfo), capped by a cgroup limit (Slurm, containers)."""
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info()
        return int(free)
    avail = _host_available()
    limit = _cgroup_headroom()
    return min(avail, limit) if limit is not None else avail


def _host_available() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30  # unknown platform: assume a modest 4 GiB


def _cgroup_headroom() -> int | None:
    """Limit minus usage of this process's cgroup (v2), or None when unlimited or unknown."""
    base = Path("/sys/fs/cgroup")
    try:
        raw = (base / "memory.max").read_text().strip()
        if raw == "max":
            return None
        return max(0, int(raw) - int((base / "memory.current").read_text()))
    except (OSError, ValueError):
        return None


def current_memory_bytes(device: str) -> int:
    """Memory this process holds now: CUDA's allocated bytes, else the resident set."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.memory_allocated())
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_memory_bytes(device)


def peak_memory_bytes(device: str) -> int:
    """Peak memory of this run: CUDA's max allocated, else the process's max resident set."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.max_memory_allocated())
    return resident_peak_bytes()


def resident_peak_bytes() -> int:
    """This process's peak resident set: VmHWM, which starts afresh at exec. Not ru_maxrss:
    Linux carries the parent's high-water mark across fork and exec into it, so a job started
    by a 1 GB process (pytest, Snakemake) would report at least 1 GB."""
    hwm = _proc_status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux


def _proc_status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_rss_high_water() -> bool:
    """Reset this process's resident-set high-water mark (Linux >= 4.0); False where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
LIVE_THRESHOLD = 64 << 10
FAST_THRESHOLD = 32 << 20  # glibc's own adaptive threshold stops here


def set_mmap_threshold(n_bytes: int) -> bool:
    """glibc: allocations of `n_bytes` or more get their own mapping, returned to the system
    when freed. False where unavailable (not glibc)."""
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, n_bytes))
    except (OSError, AttributeError):
        return False


def track_live_bytes_on_cpu() -> bool:
    """Make the process's resident set follow live allocations on Linux/glibc: every allocation
    of 64 KiB or more gets its own mapping, returned when freed. Without it glibc keeps freed
    blocks below its (adaptive, up to 32 MiB) threshold, and the resident peak measures the
    allocator's history rather than the work's tensors (CUDA's allocator statistics count live
    tensors). It costs time (a page fault per fresh page): timed runs switch it off
    (`set_mmap_threshold(FAST_THRESHOLD)`). Returns False where unavailable."""
    return set_mmap_threshold(LIVE_THRESHOLD)


class PeakMeter:
    """Peak memory of the work inside a `with` block, on the device it runs on.

    CUDA: the allocator's peak of allocated bytes inside the block (`peak`), and that minus what
    was allocated on entry (`delta`). CPU: the process's resident-set high-water mark (VmHWM,
    reset on entry through /proc/self/clear_refs) and that minus the resident set on entry.
    Where the high-water mark cannot be reset, `exact` is False and the CPU figures are the
    process's lifetime peak (ru_maxrss), an upper bound.
    """

    def __init__(self, device: str):
        self.device = device
        self.base = self.peak = 0
        self.exact = True

    def __enter__(self) -> PeakMeter:
        import gc

        gc.collect()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = int(torch.cuda.memory_allocated())
        else:
            self.exact = _reset_rss_high_water()
            self.base = current_memory_bytes(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            self.peak = int(torch.cuda.max_memory_allocated())
        else:
            hwm = _proc_status_bytes("VmHWM") if self.exact else None
            self.peak = hwm if hwm is not None else peak_memory_bytes(self.device)

    @property
    def delta(self) -> int:
        """Peak bytes the block added on top of what was held on entry."""
        return max(0, self.peak - self.base)
