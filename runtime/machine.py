"""Facts of the machine a runtime decision depends on."""

from __future__ import annotations

from pathlib import Path


def cpu_flags() -> set[str]:
    """This CPU's instruction-set flags as Linux lists them (empty where /proc/cpuinfo is not)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())
