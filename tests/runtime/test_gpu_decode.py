"""runtime/gpu_decode.py: nvJPEG for JPEG batches on a GPU, the caller's CPU path for everything else.
Without CUDA every body takes the CPU path (tested here on any machine); with CUDA (marked gpu) nvJPEG's rows
are close to the exact decode's and a bad body in a batch costs only its own row."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from contract.records import ImageContract
from runtime.gpu_decode import NvjpegDecoder, nvjpeg_orientation
from runtime.images import ImageError, ImageProblem, decode_upright, preprocess

CONTRACT = ImageContract(232, (224, 224), "bilinear", decode="draft")


def jpeg(size=(800, 600), orientation: int | None = None, mode: str = "RGB") -> bytes:
    image = Image.effect_mandelbrot(size, (-2, -1.5, 1, 1.5), 64).convert(mode)
    exif = Image.Exif()
    if orientation:
        exif[0x0112] = orientation
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, exif=exif)
    return buffer.getvalue()


def png() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), "red").save(buffer, "PNG")
    return buffer.getvalue()


def cpu_path(body: bytes):
    try:
        return preprocess(decode_upright(body), CONTRACT)
    except ImageError as error:
        return error


def test_only_jpegs_within_the_limits_in_rgb_or_grey_go_to_nvjpeg():
    assert nvjpeg_orientation(jpeg()) == 1 and nvjpeg_orientation(jpeg(orientation=6)) == 6
    assert nvjpeg_orientation(jpeg(mode="L")) == 1
    assert nvjpeg_orientation(jpeg(mode="CMYK")) is None  # nvJPEG's colour conversion is not libjpeg's
    assert nvjpeg_orientation(png()) is None
    assert nvjpeg_orientation(b"\xff\xd8\xff" + b"\x00" * 40) is None  # broken: the CPU path says why
    assert nvjpeg_orientation(jpeg(size=(20_000, 10))) is None  # over MAX_SIDE: refused by the CPU path


def test_without_cuda_every_body_takes_the_callers_cpu_path_in_order():
    decoder = NvjpegDecoder("cpu", CONTRACT)
    assert not decoder.available
    bodies = [jpeg(), b"not an image", png(), jpeg(orientation=6)]
    rows = decoder(bodies, cpu_path)
    assert isinstance(rows[1], ImageError) and rows[1].problem is ImageProblem.NOT_AN_IMAGE
    for body, row in zip(bodies, rows):
        if not isinstance(row, ImageError):
            assert torch.equal(row, cpu_path(body))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nvjpeg_rows_are_close_to_the_exact_decode_and_bad_bodies_keep_their_errors():
    decoder = NvjpegDecoder("cuda:0", CONTRACT)
    assert decoder.available
    bodies = [jpeg((2400, 1800)), jpeg((1800, 2400), orientation=6), png()]
    rows = decoder(bodies, lambda body: cpu_path(body).to("cuda:0") if not isinstance(cpu_path(body), ImageError)
                   else cpu_path(body))
    for body, row in zip(bodies, rows):
        levels = (row.cpu() - cpu_path(body)).abs() * 255
        assert levels.mean() < 1.0, levels.mean()  # the decode check's bound for draft
    broken = decoder([jpeg(), jpeg()[:-2000] + b"\x00" * 10, jpeg()], cpu_path)
    assert not isinstance(broken[0], ImageError) and not isinstance(broken[2], ImageError)
