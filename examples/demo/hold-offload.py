#!/usr/bin/env python3
"""A live holder of an offload file, as a vLLM worker is one: it maps PATH (SIZE MiB, written) and holds it open
until it is ended. The file appears under its name only once it is mapped (made under a temporary name, then
renamed), so a look at the directory never sees it unheld.

    python3 examples/demo/hold-offload.py /run/reconciler-demo/shm/vllm_offload_live.mmap 8 &
"""

import mmap
import os
import signal
import sys

path, mib = sys.argv[1], int(sys.argv[2])
size = mib << 20
tmp = os.path.join(os.path.dirname(path), f".hold-{os.getpid()}")
fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.ftruncate(fd, size)
m = mmap.mmap(fd, size)
m[:] = b"\1" * size
os.rename(tmp, path)
print(f"holding {path} ({mib} MiB), mapped and open, as pid {os.getpid()}", flush=True)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
signal.sigwait({signal.SIGTERM, signal.SIGINT})
