"""The decoder fuzzers' seed corpus: one small valid image of every format and variant runtime.images accepts,
made by code from scikit-image's chelsea photograph (so no binary file is committed). Same PIL, same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from gates.photos import sample_photo

SEED_SIZE = (40, 30)  # width, height: small enough for thousands of decodes a second, over MIN_SIDE
EXIF_ORIENTATION = 0x0112


def photo(mode: str = "RGB") -> Image.Image:
    """chelsea (the cat), shrunk to SEED_SIZE, in the given PIL mode."""
    return Image.fromarray(sample_photo("chelsea")).resize(SEED_SIZE, Image.LANCZOS).convert(mode)


def encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def translucent() -> Image.Image:
    """The photo with an alpha ramp from opaque (left) to transparent (right)."""
    image = photo("RGBA")
    ramp = np.linspace(255, 0, SEED_SIZE[0], dtype=np.uint8)
    image.putalpha(Image.fromarray(np.tile(ramp, (SEED_SIZE[1], 1))))
    return image


def _jpeg_exif_sideways() -> bytes:
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6
    return encoded(photo(), "JPEG", quality=85, exif=exif)


def _png_16_bit() -> bytes:
    grey = np.asarray(photo("L"), dtype=np.uint16) * 257
    return encoded(Image.fromarray(grey), "PNG")  # mode I;16


def _png_palette_transparent() -> bytes:
    return encoded(photo().quantize(16), "PNG", transparency=0)


def _gif_animated() -> bytes:
    frames = [photo().quantize(32), photo().rotate(180).quantize(32)]
    return encoded(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)


def _tiff_float() -> bytes:
    grey = np.asarray(photo("L"), dtype=np.float32) / 255.0
    return encoded(Image.fromarray(grey, mode="F"), "TIFF")


def _tiff_16_bit() -> bytes:
    grey = np.asarray(photo("L"), dtype=np.uint16) * 257
    return encoded(Image.fromarray(grey), "TIFF")  # mode I;16


def _png_text_and_icc() -> bytes:
    from PIL import ImageCms, PngImagePlugin
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "chelsea")
    info.add_text("Description", "a cat " * 10, zip=True)  # zTXt: compressed text
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    return encoded(photo(), "PNG", pnginfo=info, icc_profile=icc)


def _tiff_orientation_8() -> bytes:
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 8
    return encoded(photo(), "TIFF", exif=exif)


def _webp_animated() -> bytes:
    return encoded(photo(), "WEBP", save_all=True, append_images=[photo().rotate(180)], duration=100)


def _mpo() -> bytes:
    return encoded(photo(), "MPO", save_all=True, append_images=[photo().rotate(180)], quality=85)


SEEDS: dict[str, Callable[[], bytes]] = {
    "jpeg.jpg": lambda: encoded(photo(), "JPEG", quality=85),
    "jpeg-exif-orientation-6.jpg": _jpeg_exif_sideways,
    "jpeg-progressive.jpg": lambda: encoded(photo(), "JPEG", quality=85, progressive=True),
    "jpeg-grey.jpg": lambda: encoded(photo("L"), "JPEG", quality=85),
    "jpeg-cmyk.jpg": lambda: encoded(photo("CMYK"), "JPEG", quality=85),
    "png-rgb.png": lambda: encoded(photo(), "PNG"),
    "png-16-bit.png": _png_16_bit,
    "png-palette-transparent.png": _png_palette_transparent,
    "png-rgba.png": lambda: encoded(translucent(), "PNG"),
    "png-text-icc.png": _png_text_and_icc,
    "webp-lossy.webp": lambda: encoded(photo(), "WEBP", quality=80),
    "webp-lossless-alpha.webp": lambda: encoded(translucent(), "WEBP", lossless=True),
    "webp-animated.webp": _webp_animated,
    "bmp-rgb.bmp": lambda: encoded(photo(), "BMP"),
    "bmp-palette.bmp": lambda: encoded(photo().quantize(16), "BMP"),
    "gif-animated.gif": _gif_animated,
    "gif-transparent.gif": lambda: encoded(photo().quantize(16), "GIF", transparency=0),
    "tiff-rgb.tiff": lambda: encoded(photo(), "TIFF"),
    "tiff-lzw.tiff": lambda: encoded(photo(), "TIFF", compression="tiff_lzw"),
    "tiff-jpeg.tiff": lambda: encoded(photo(), "TIFF", compression="jpeg"),
    "tiff-deflate.tiff": lambda: encoded(photo(), "TIFF", compression="tiff_adobe_deflate"),
    "tiff-orientation-8.tiff": _tiff_orientation_8,
    "tiff-float.tiff": _tiff_float,
    "tiff-16-bit.tiff": _tiff_16_bit,
    "mpo.jpg": _mpo,
}


def seed_corpus() -> dict[str, bytes]:
    """File name -> bytes of every seed."""
    return {name: make() for name, make in SEEDS.items()}


def write_seed_corpus(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in seed_corpus().items():
        (folder / name).write_bytes(data)
        paths.append(folder / name)
    return paths
