"""Hold GPU memory from a real CUDA process until told to stop: the stray process of the GPU proof.

Used by ``examples/gpu-proof/run.sh`` and ``tests/real/test_gpu_real.py``. It allocates ``--mib`` MiB on the GPU
that NVML calls ``--index`` (PyTorch), or all its free memory but ``--leave-free-mib`` MiB, prints one JSON line ``{"pid", "index", "bytes"}`` once the memory is
really taken, then waits until its stdin closes, it is signalled, or ``--seconds`` pass (so a forgotten
holder never outlives a test run by much).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--index", type=int, default=0, help="the GPU's NVML index (as nvidia-smi shows it)")
    ap.add_argument("--mib", type=int, default=1024, help="MiB to allocate on it")
    ap.add_argument(
        "--leave-free-mib",
        type=int,
        default=None,
        help="instead of --mib: take all the GPU's free memory but this many MiB (as the driver counts)",
    )
    ap.add_argument("--seconds", type=float, default=600, help="give up holding after this long")
    args = ap.parse_args()
    # CUDA numbers GPUs fastest first by default; NVML and the container runtime use PCI bus order.
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = str(args.index)
    import torch

    nbytes = args.mib * 1024 * 1024
    if args.leave_free_mib is not None:
        torch.cuda.init()
        torch.empty(1, device="cuda:0")  # the CUDA context first: it takes memory of its own
        free, _total = torch.cuda.mem_get_info(0)
        nbytes = max(0, free - args.leave_free_mib * 1024 * 1024)
    block = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    block.fill_(1)  # touch it: the memory is in use, not only reserved
    torch.cuda.synchronize()
    print(json.dumps({"pid": os.getpid(), "index": args.index, "bytes": block.numel()}), flush=True)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sys.stdin], [], [], 1.0)
        if ready and not sys.stdin.buffer.read1(4096):
            break  # stdin closed: the caller is done with us
    del block
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
