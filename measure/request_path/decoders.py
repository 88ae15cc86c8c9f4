"""`python -m measure decoders`: JPEG decoders compared on the bodies users send, one thread, one process.

    python -m examples.photo_sizes bodies/
    python -m measure decoders --images bodies/ [--resize 232] [--seconds 2]

Per JPEG body (upright, EXIF orientation applied by each):
  PIL exact           runtime.images.decode_image: what the handler runs with decode: exact
  PIL draft           the same with libjpeg's DCT scaling (sides kept >= 2x --resize): decode: draft
  torchvision         torchvision.io.decode_jpeg(..., apply_exif_orientation=True), CPU
and beside each the largest pixel difference from PIL exact where the sizes match ("-": a reduced decode).
PIL is built on libjpeg-turbo (PIL.features reports its version), the library a separate binding such as
simplejpeg or PyTurboJPEG would wrap, and draft already gives libjpeg-turbo's DCT scaling, so no third
binding is compared: it could save a copy, not the decoding. torchvision 0.29 marks its decoders deprecated
(TorchCodec replaces them); its warning is captured and listed once. Writes decoders.md and decoders.json.
"""

from __future__ import annotations

import argparse
import statistics
import warnings
from pathlib import Path

import torch

from measure.command import write_tables
from measure.request_path.stages import bodies
from runtime.images import DRAFT_FACTOR, decode_image, shown_size
from runtime.timing import time_runs

WARMUP_RUNS = 2
MIN_RUNS = 5
JPEG_SUFFIXES = (".jpg", ".jpeg")


def torchvision_decode(data: bytes) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_jpeg
    return decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB,
                       apply_exif_orientation=True)


def decoders(resize: int) -> dict:
    return {"PIL exact": decode_image, "PIL draft": lambda data: decode_image(data, DRAFT_FACTOR * resize),
            "torchvision": torchvision_decode}


def measure(path: Path, resize: int, seconds: float) -> list[dict]:
    data = path.read_bytes()
    reference = decode_image(data)
    rows = []
    for name, decode in decoders(resize).items():
        image = decode(data)
        same_size = image.shape == reference.shape
        ms = statistics.median(time_runs(lambda decode=decode: decode(data), WARMUP_RUNS, MIN_RUNS, seconds))
        rows.append({"body": path.name, "shown": list(shown_size(data)), "decoder": name,
                     "decoded": [int(image.shape[2]), int(image.shape[1])], "ms": round(ms, 2),
                     "max_diff_vs_exact": int((image.int() - reference.int()).abs().max()) if same_size else None})
    return rows


def markdown(rows: list[dict], context: dict) -> str:
    lines = [f"# JPEG decoders, one thread ({context['libjpeg']})", "",
             "| body | shown | decoder | decoded | ms | images/s | max diff vs PIL exact |", "|" + "---|" * 7]
    for r in rows:
        diff = "-" if r["max_diff_vs_exact"] is None else str(r["max_diff_vs_exact"])
        lines.append(f"| {r['body']} | {'x'.join(map(str, r['shown']))} | {r['decoder']} | "
                     f"{'x'.join(map(str, r['decoded']))} | {r['ms']:.1f} | {1000 / r['ms']:.1f} | {diff} |")
    if context["warnings"]:
        lines += ["", "Warnings (once each): " + "; ".join(context["warnings"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from contract.cli import run_command  # our errors become one line and an exit code
    return run_command(lambda: _main(argv))


def _main(argv: list[str] | None) -> int:
    from PIL import features
    parser = argparse.ArgumentParser(prog="python -m measure decoders", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, default=Path("examples/cat.jpg"), help="a JPEG, or a folder of them")
    parser.add_argument("--resize", type=int, default=232, help="the contract's resize (draft's floor is twice "
                                                                 "it; default: resnet50's %(default)s)")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per decoder and body")
    parser.add_argument("--out", type=Path, default=Path("bench-results/decoders"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    files = [p for p in bodies(args.images) if p.suffix.lower() in JPEG_SUFFIXES]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = [row for path in files for row in measure(path, args.resize, args.seconds)]
    context = {"libjpeg": f"PIL {features.version('pil')} on libjpeg-turbo {features.version_feature('libjpeg_turbo')}",
               "resize": args.resize, "warnings": sorted({f"{w.category.__name__}: {str(w.message)[:160]}"
                                                          for w in caught})}
    report = markdown(rows, context)
    write_tables(args.out, "decoders", report, context, rows)
    return 0
