"""What machine and libraries produced a result, for the files and pages that record it: the CPU,
the vector kernels kvsim, OpenBLAS and PyTorch picked (and the variables that choose them), and
the libraries' versions. Numbers that depend on the kernels (float32 sums in another order) are
the same bytes only where these match."""
import ctypes
import ctypes.util
import os
import platform

__all__ = ["describe_machine"]

KERNEL_VARIABLES = ("KVSIM_SIMD", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "ATEN_CPU_CAPABILITY",
                    "ONEDNN_MAX_CPU_ISA")


def _cpu_name():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor()


def describe_machine():
    """{cpu, cores, python, numpy, torch, torch_cpu_capability, kvsim_simd, openblas_core,
    openblas, environment}; a library that cannot be loaded is recorded as None."""
    import numpy as np

    found = {"cpu": _cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
             "numpy": np.__version__, "torch": None, "torch_cpu_capability": None}
    try:
        import torch
        found["torch"] = torch.__version__
        found["torch_cpu_capability"] = next(
            (line.split(":", 1)[1].strip() for line in torch.__config__.show().split("\n")
             if "CPU capability usage" in line), None)
    except ImportError:
        pass
    try:
        from kvsim import _kvsim
        found["kvsim_simd"] = _kvsim.simd()
    except (ImportError, AttributeError):
        found["kvsim_simd"] = None
    found["environment"] = {k: os.environ[k] for k in KERNEL_VARIABLES if k in os.environ}
    try:
        blas = ctypes.CDLL(ctypes.util.find_library("openblas") or "libopenblas.so.0")
        blas.openblas_get_corename.restype = ctypes.c_char_p
        blas.openblas_get_config.restype = ctypes.c_char_p
        found["openblas_core"] = blas.openblas_get_corename().decode()
        found["openblas"] = blas.openblas_get_config().decode()
    except (OSError, AttributeError):
        found["openblas_core"] = found["openblas"] = None
    return found
