"""Hold GPU memory so that CUDA has only a capped card's total left free: the H200 as a 24 GiB card for real.

autotune's memory cap translates gpu_memory_utilization so that vLLM reserves what the small card would; what
vLLM does not govern (the caching allocator's growth while serving: +1.29 GiB past its budget on the captured
stop-21 trial) still finds an H200's 100 GiB free, where a 3090 has 0.7-1.9 GiB. With this ballast held, such
growth meets the small card's limit as it would there, so a capped boot fails or serves as it would on the card.

    python3 -m benchmarks.h200.ballast --gpu 0 --leave-gib 23.62

Prints one line once held (what CUDA says is free then) and holds until stdin closes or a signal.
The CUDA driver API through ctypes: no torch, no vLLM, only the driver library every CUDA machine has.
"""

from __future__ import annotations

import argparse
import ctypes
import sys

GiB = 1 << 30
MiB = 1 << 20


def _check(cuda: ctypes.CDLL, rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        raise SystemExit(f"ballast: {what} failed: {(name.value or b'?').decode()} ({rc})")


def mem_info(cuda: ctypes.CDLL) -> tuple[int, int]:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _check(cuda, cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
    return free.value, total.value


def hold(gpu: int, leave_bytes: int) -> tuple[int, int, int]:
    """Allocate until CUDA says `leave_bytes` are free on `gpu` (within 2 MiB, the allocation granularity);
    returns (held, free, total) bytes. The allocations live as long as this process."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise SystemExit(f"ballast: no CUDA driver here ({e})") from None
    _check(cuda, cuda.cuInit(0), "cuInit")
    device, context = ctypes.c_int(), ctypes.c_void_p()
    _check(cuda, cuda.cuDeviceGet(ctypes.byref(device), gpu), "cuDeviceGet")
    _check(cuda, cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
    _check(cuda, cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    held = 0
    for _ in range(4):  # the context and the allocator's own bookkeeping move "free" a little after each step
        free, total = mem_info(cuda)
        more = (free - leave_bytes) // (2 * MiB) * (2 * MiB)
        if more <= 0:
            break
        pointer = ctypes.c_uint64()
        _check(cuda, cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(more)), f"cuMemAlloc({more})")
        held += more
    free, total = mem_info(cuda)
    return held, free, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--leave-gib", type=float, required=True, help="GiB CUDA is to have free while held.")
    opts = ap.parse_args()
    held, free, total = hold(opts.gpu, int(opts.leave_gib * GiB))
    print(f"ballast: holding {held / GiB:.3f} GiB on GPU {opts.gpu}; CUDA free {free / GiB:.3f} of "
          f"{total / GiB:.3f} GiB", flush=True)
    sys.stdin.read()  # until the recorder closes it (or a signal ends the process)


if __name__ == "__main__":
    main()
