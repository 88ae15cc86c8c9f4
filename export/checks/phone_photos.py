"""Phone-like photos made from scikit-image's photographs (gates.photos) at the sizes users send.

The default calibration and held-out images are crops of the photographs (export.precision.calibration).
examples/photo_sizes.py writes the phone-like ones as the serving benchmark's bodies; export/checks/decode.py
measures what draft decoding changes on them. A photograph enlarged to phone size is smoother than a camera's, so seeded
sensor grain is added before encoding: file sizes then land where phone JPEGs do (megabytes, not hundreds of
kilobytes), and the fine detail that decoding at a reduced scale could change is there to be changed.
Phone-like JPEG: quality 90, 4:2:0 chroma. Same seed, same bytes.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from gates.photos import sample_photo

EXIF_ORIENTATION = 0x0112
ROTATED_90_CW = 6  # the viewer turns the stored raster 90 degrees clockwise to show it upright
JPEG_QUALITY = 90
GRAIN_STD = 4.0  # in 0..255 levels: a phone sensor's noise after its denoiser, roughly


def upright_photo(name: str, shown: tuple[int, int], rng: np.random.Generator,
                  box: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)) -> Image.Image:
    """Photograph `name` (its region `box`: top, left, height, width as fractions) centre-cropped to the aspect
    of `shown` (width, height), resized to it, with grain."""
    photo = sample_photo(name)
    height, width = photo.shape[:2]
    top, left, box_h, box_w = box
    region = Image.fromarray(photo[int(top * height): int((top + box_h) * height),
                                   int(left * width): int((left + box_w) * width)])
    out_w, out_h = shown
    scale = min(region.width / out_w, region.height / out_h)
    crop_w, crop_h = round(out_w * scale), round(out_h * scale)
    x, y = (region.width - crop_w) // 2, (region.height - crop_h) // 2
    resized = region.crop((x, y, x + crop_w, y + crop_h)).resize((out_w, out_h), Image.LANCZOS)
    pixels = np.asarray(resized, dtype=np.float32)
    pixels += GRAIN_STD * rng.standard_normal((out_h, out_w, 3), dtype=np.float32)  # float32: half float64's time
    pixels += 0.5
    return Image.fromarray(np.clip(pixels, 0, 255, out=pixels).astype(np.uint8))


def phone_jpeg(image: Image.Image, sideways: bool = False, quality: int = JPEG_QUALITY) -> bytes:
    """A phone's JPEG of the upright image; sideways: the raster stored turned back, with the EXIF tag that
    shows it upright (as phones store portrait photos)."""
    buffer = io.BytesIO()
    exif = Image.Exif()
    if sideways:
        image = image.transpose(Image.Transpose.ROTATE_90)
        exif[EXIF_ORIENTATION] = ROTATED_90_CW
    image.save(buffer, format="JPEG", quality=quality, subsampling="4:2:0", exif=exif)
    return buffer.getvalue()


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
