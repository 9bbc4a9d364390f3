"""CUDA devices as the process sees them, asked once of the CUDA runtime."""

from __future__ import annotations

import ctypes

from ..errors import UnsupportedError
from .runtime import find_runtime

_gpu_probe: tuple[int, str] | None = None
_runtime_path: str | None = None  # the CUDA runtime library the probe loaded


def cuda_devices() -> tuple[int, str]:
    """(number of CUDA devices this process sees, why none when 0), asked once of the CUDA
    runtime (``libcudart.so.12``: the Triton runtime's copy, else the system's)."""
    global _gpu_probe, _runtime_path
    if _gpu_probe is not None:
        return _gpu_probe
    names = []
    try:
        names += sorted(str(p) for p in find_runtime().lib_dir.glob("libcudart*.so*"))
    except Exception:  # no runtime: try the system's CUDA runtime only
        pass
    names.append("libcudart.so.12")
    count, why = 0, "no CUDA runtime library (libcudart.so.12) could be loaded"
    for name in names:
        try:
            cudart = ctypes.CDLL(name)
        except OSError:
            continue
        n = ctypes.c_int(0)
        rc = cudart.cudaGetDeviceCount(ctypes.byref(n))
        _runtime_path = name
        count, why = (n.value, "") if rc == 0 else (0, f"cudaGetDeviceCount failed with CUDA error {rc}")
        if count == 0 and not why:
            why = "the CUDA runtime reports no device"
        break
    _gpu_probe = (count, why)
    return _gpu_probe


def require_gpu(what: str, device: int = 0) -> None:
    """Raise a clear UnsupportedError when ``what`` needs a CUDA GPU the process does not see."""
    count, why = cuda_devices()
    if count == 0:
        raise UnsupportedError(f"{what} needs a CUDA GPU, and this process sees none ({why})")
    if device >= count:
        raise UnsupportedError(f"{what} asks for GPU {device}, but this process sees {count} GPU(s)")


def cuda_runtime_path() -> str | None:
    """The CUDA runtime library that sees this process's GPUs (for the native module's device
    copies), or None without a GPU."""
    count, _ = cuda_devices()
    return _runtime_path if count else None
