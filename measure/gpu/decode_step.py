"""The GPU check's decode step: request bodies -> input rows on the GPU, three ways, per photo size and batch.

  cpu exact   runtime.images.decode_upright (every pixel) + preprocess on the CPU, rows copied to the GPU
  cpu draft   the same with libjpeg's DCT scaling (the decode mode a passed decode check serves)
  nvjpeg      runtime.gpu_decode.NvjpegDecoder: one batched nvJPEG call, resize and crop on the GPU

Each row: milliseconds per image (median of TIMED_RUNS after WARMUP_RUNS, CUDA synchronised) and how far
its rows are from the exact decode's (0..255 levels, mean and max). The bodies are made from examples/cat.jpg
(no scikit-image on a bare GPU machine): enlarged to phone sizes with grain, JPEG quality 90, the 12 MP one
stored sideways with its EXIF orientation tag, as phones store portrait photos.
"""

from __future__ import annotations

import io
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from measure.gpu.environment import import_problems
from measure.gpu.report import Status, Step

DEVICE = "cuda:0"
RESIZE, CROP = 232, (224, 224)  # resnet50's contract (what the check exports)
SIZES = {"vga": (640, 480), "2mp": (1600, 1200), "12mp-sideways": (4032, 3024)}
BATCHES = (1, 8, 32)
WARMUP_RUNS = 3
TIMED_RUNS = 10
GRAIN_STD = 4.0
PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class DecodeRow:
    body: str
    path: str
    batch: int
    ms_per_image: float
    images_per_s: float
    mean_levels_vs_exact: float
    max_levels_vs_exact: float


def phone_body(size: tuple[int, int], sideways: bool, seed: int) -> bytes:
    import numpy as np
    from PIL import Image
    photo = Image.open(PROJECT_ROOT / "examples" / "cat.jpg").convert("RGB").resize(size, Image.LANCZOS)
    pixels = np.asarray(photo, dtype=np.float32)
    pixels += GRAIN_STD * np.random.default_rng(seed).standard_normal(pixels.shape, dtype=np.float32)
    image = Image.fromarray(np.clip(pixels + 0.5, 0, 255).astype(np.uint8))
    exif = Image.Exif()
    if sideways:
        image, exif[0x0112] = image.transpose(Image.Transpose.ROTATE_90), 6
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, subsampling="4:2:0", exif=exif)
    return buffer.getvalue()


def decode_paths(contract):
    """path name -> function(bodies) -> (N, 3, crop) float32 on the GPU."""
    import torch

    from runtime.gpu_decode import NvjpegDecoder
    from runtime.images import decode_upright, draft_floor, preprocess
    floor = draft_floor(contract, "draft")
    nvjpeg = NvjpegDecoder(DEVICE, contract)

    def on_cpu(floor_or_none):
        return lambda bodies: torch.stack([preprocess(decode_upright(b, floor_or_none), contract) for b in bodies]).to(DEVICE)

    def on_gpu(bodies):
        rows = nvjpeg(bodies, lambda b: preprocess(decode_upright(b, floor), contract).to(DEVICE))
        return torch.stack(rows)

    return {"cpu exact": on_cpu(None), "cpu draft": on_cpu(floor), "nvjpeg": on_gpu}, nvjpeg.available


def time_path(run, bodies) -> float:
    import torch
    samples = []
    for index in range(WARMUP_RUNS + TIMED_RUNS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        run(bodies)
        torch.cuda.synchronize()
        if index >= WARMUP_RUNS:
            samples.append((time.perf_counter() - start) * 1000 / len(bodies))
    return statistics.median(samples)


def decode_step(out: Path, log) -> Step:
    problems = import_problems(("torchvision", "PIL", "numpy"))
    if problems:
        return Step("decode", Status.SKIPPED, notes=[f"{name} does not import: {why}" for name, why in problems.items()])
    from contract.records import ImageContract
    contract = ImageContract(RESIZE, CROP, "bilinear", decode="draft")
    paths, available = decode_paths(contract)
    notes = [] if available else ["nvJPEG unavailable (CUDA or torchvision's GPU image ops missing): the nvjpeg "
                                  "rows ran the CPU fallback"]
    rows = []
    for seed, (name, size) in enumerate(SIZES.items()):
        body = phone_body(size, sideways="sideways" in name, seed=seed)
        exact = paths["cpu exact"]([body])
        for path, run in paths.items():
            levels = (run([body]) - exact).abs() * 255
            for batch in BATCHES:
                ms = time_path(run, [body] * batch)
                rows.append(DecodeRow(name, path, batch, round(ms, 3), round(1000 / ms, 1),
                                      round(levels.mean().item(), 3), round(levels.max().item(), 1)))
                log(f"decode {name} {path} b={batch}: {ms:.2f} ms/image")
    return Step("decode", Status.RAN, rows, notes)
