"""Peak resident memory of the current process, shared by the memory benchmarks."""

from __future__ import annotations

import resource
import sys
from pathlib import Path


def peak_rss_mib() -> float:
    """Peak RSS of this process image in MiB. Linux's ``VmHWM``, because ``ru_maxrss`` survives
    ``exec``: a child forked from the big parent that built the inputs would report the
    parent's size. Elsewhere ``ru_maxrss`` (bytes on macOS, KiB on Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
