"""Memory read bandwidth in GB/s, every core reading its part of a 512 MiB buffer (best of
three), as engine-bench measures it. Printed with one decimal for the engine benchmarks to
record beside their results."""

import os
import threading
import time

import numpy as np

buffer = np.arange(64 << 20, dtype=np.uint64)
parts = np.array_split(buffer, os.cpu_count())
best = 0.0
for _ in range(3):
    start = time.perf_counter()
    threads = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    best = max(best, buffer.nbytes / (time.perf_counter() - start) / 1e9)
print(f"{best:.1f}")
