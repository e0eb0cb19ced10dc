#!/usr/bin/env python3
"""fdatasync latency of a directory's device: a 4 KiB pwrite then fdatasync, N times.

Usage: scripts/fsync-latency.py DIR [N]   (default N = 2000; writes an 8 MiB file in DIR,
removed afterwards). Prints percentiles and the mean in microseconds: the figure the group
commit's back of the envelope (DESIGN.md, "Group commit, pipelined") starts from.
"""
import os
import sys
import time


def main():
    directory = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    path = os.path.join(directory, "fsync-latency-probe")
    file_bytes = 8 << 20
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, file_bytes)
        os.fdatasync(fd)
        lat_us = []
        for i in range(n):
            os.pwrite(fd, b"x" * 4096, (i * 4096) % file_bytes)
            start = time.perf_counter()
            os.fdatasync(fd)
            lat_us.append((time.perf_counter() - start) * 1e6)
    finally:
        os.close(fd)
        os.unlink(path)
    lat_us.sort()
    pick = lambda q: lat_us[min(n - 1, int(n * q))]
    print(
        f"fdatasync after a 4 KiB pwrite, n={n}: p10 {pick(0.1):.0f} p50 {pick(0.5):.0f} "
        f"p90 {pick(0.9):.0f} p99 {pick(0.99):.0f} mean {sum(lat_us) / n:.0f} us"
    )


if __name__ == "__main__":
    main()
