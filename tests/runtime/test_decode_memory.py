"""Peak memory of one request's decode + preprocess, measured in a fresh process, and bounded from arithmetic.

The body is a 12 MP phone JPEG (4032x3024 stored sideways, EXIF Orientation 6) from examples/photo_sizes.py,
decoded and preprocessed exactly as handlers.core does (runtime.images.decode_upright, then preprocess with
resnet50's contract), at the CPU worker's one thread. The child process imports everything and runs a small JPEG
through the same path first, so one-time costs are in the baseline; then it resets the kernel's peak-RSS mark
(/proc/self/clear_refs) and the figure is the peak (VmHWM) after the request minus the RSS before it. Not
getrusage's ru_maxrss: Linux carries it across exec, so a child of pytest starts with pytest's own peak (well
above a request's) and sees no request at all; run from a shell, ru_maxrss gives the same figure.
docs/results/2026-11-25-request-path-memory/ records the figures and where they come from.

    python -m tests.runtime.test_decode_memory PHOTO.jpg     # the measurement, as JSON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow  # three fresh processes, each importing torch and decoding a 12 MP JPEG

MIB = 2**20
PHONE_PIXELS = 4032 * 3024  # 12.19 Mpx
# Bytes per source pixel alive at the request's peak (during preprocess's resize):
DECODED_UINT8 = 3  # the decoded RGB pixels, kept until preprocess returns (at least)
# The bound of the path that resized in float32 (a uint8 tensor, then torchvision's v1 resize: 3 + 12 + 1 bytes per
# pixel); the served path now stays far under it: PIL's 4-byte RGB image (turned upright, for a photo stored
# sideways), its packed 3-byte copy that torchvision.transforms.v2 resizes as uint8, and PIL's packing buffers
# (about 10 bytes per pixel at the peak, docs/results/2026-11-25-request-path-memory/).
RESIZE_FLOAT32 = 12
RESIZE_OTHER = 1
ALLOCATOR_HEADROOM = 1.10  # malloc arenas and torch's allocator keep some freed memory
BOUND_BYTES_PER_PIXEL = (DECODED_UINT8 + RESIZE_FLOAT32 + RESIZE_OTHER) * ALLOCATOR_HEADROOM  # 17.6
RESNET50_CONTRACT = {"resize": 232, "crop": [224, 224], "interpolation": "bilinear", "antialias": True}
WORKER_THREADS = 1  # a CPU worker's torch threads on this 2-core machine (handlers/policy.py: cores / workers)
WARM_UP_SIZE = (640, 480)


def measure(photo: Path, address_space_extra_mib: int | None = None, decode: str = "exact") -> dict:
    """In this (fresh) process: the request path's peak RSS above the warmed-up baseline, in MiB. With
    address_space_extra_mib, RLIMIT_AS is set that far above the current address space first, and the
    type of what decode_upright raised is reported instead."""
    import torch

    from contract.records import ImageContract
    from runtime.images import decode_upright, preprocess
    torch.set_num_threads(WORKER_THREADS)
    from runtime.images import draft_floor
    contract = ImageContract.from_dict({**RESNET50_CONTRACT, "decode": decode})
    floor = draft_floor(contract)
    preprocess(decode_upright(small_jpeg(), floor), contract)
    data = photo.read_bytes()
    if address_space_extra_mib is not None:
        return {"raised": raised_under_limit(data, address_space_extra_mib)}
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    baseline = memory_kib("VmRSS") * 1024
    row = preprocess(decode_upright(data, floor), contract)
    peak = memory_kib("VmHWM") * 1024
    return {"baseline_mib": round(baseline / MIB, 1), "peak_mib": round(peak / MIB, 1),
            "request_mib": round((peak - baseline) / MIB, 1), "row": list(row.shape), "threads": WORKER_THREADS}


def memory_kib(field: str) -> int:
    """A line of /proc/self/status (VmRSS: resident now, VmHWM: the peak), in KiB."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1])


def raised_under_limit(data: bytes, extra_mib: int) -> str:
    import resource

    from runtime.images import decode_upright
    pages = int(Path("/proc/self/statm").read_text().split()[0])
    limit = pages * os.sysconf("SC_PAGE_SIZE") + extra_mib * MIB
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        decode_upright(data)
    except BaseException as error:  # reported by name: what a caller (the handler) would see
        return type(error).__name__
    return "nothing"


def small_jpeg() -> bytes:
    import io

    from PIL import Image
    buffer = io.BytesIO()
    Image.new("RGB", WARM_UP_SIZE, (90, 120, 30)).save(buffer, "JPEG")
    return buffer.getvalue()


def run_child(photo: Path, *args: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "tests.runtime.test_decode_memory", str(photo), *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(WORKER_THREADS)})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def phone_photo(tmp_path_factory) -> Path:
    from examples.photo_sizes import write_bodies
    folder = tmp_path_factory.mktemp("photo-sizes")
    write_bodies(folder)
    return folder / "12mp-sideways.jpg"


CHILD_ARGS = {"exact": (), "draft": ("--draft",), "out of memory": ("--address-space-extra-mib", "80")}


@pytest.fixture(scope="module")
def children(phone_photo) -> dict[str, Future]:
    """Each measurement's child process, all started at once: each measures only its own memory, so they need
    not wait for each other."""
    with ThreadPoolExecutor(len(CHILD_ARGS)) as pool:
        yield {name: pool.submit(run_child, phone_photo, *args) for name, args in CHILD_ARGS.items()}


def test_peak_rss_of_a_12_mp_request_is_bounded(children):
    figures = children["exact"].result()
    print(f"12 MP decode + preprocess: {figures}")
    assert figures["row"] == [3, 224, 224]
    request = figures["request_mib"] * MIB
    assert request >= DECODED_UINT8 * PHONE_PIXELS, f"{figures}: less than the decoded image itself, not measured"
    assert request <= BOUND_BYTES_PER_PIXEL * PHONE_PIXELS, (
        f"{figures}: over {BOUND_BYTES_PER_PIXEL:.1f} bytes per pixel "
        f"({BOUND_BYTES_PER_PIXEL * PHONE_PIXELS / MIB:.0f} MiB); a new full-size copy on the request path?")


def test_a_12_mp_request_decoded_in_draft_costs_a_fraction(children):
    figures = children["draft"].result()
    print(f"12 MP draft decode + preprocess: {figures}")
    # libjpeg decodes it at 1/4 (1008x756): the same arithmetic on those pixels, twice over for the decoder's
    # own buffers (its coefficient rows are the full-size image's width); measured: docs/results/2026-11-25-request-path-memory/
    decoded = (4032 // 4) * (3024 // 4)
    assert figures["row"] == [3, 224, 224]
    assert DECODED_UINT8 * decoded <= figures["request_mib"] * MIB <= 2 * BOUND_BYTES_PER_PIXEL * decoded, figures


def test_out_of_memory_while_decoding_is_not_a_corrupt_image(children):
    # 80 MiB more address space: PIL's first 46.5 MiB image fits, turning it upright does not; PIL raises
    # MemoryError from its own code, which decode_upright must pass on (a 500), not refuse as a corrupt image
    assert children["out of memory"].result() == {"raised": "MemoryError"}


if __name__ == "__main__":
    extra = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[2] == "--address-space-extra-mib" else None
    mode = "draft" if "--draft" in sys.argv else "exact"
    print(json.dumps(measure(Path(sys.argv[1]), extra, mode)))
