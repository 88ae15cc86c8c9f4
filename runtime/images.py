"""Image bytes -> the artifact's input row: decoding with its safety limits, and the preprocessing the
model's weights were evaluated with. The handler serves requests through these functions, and export-time
tools (calibration, accuracy checks) read image folders through the very same ones.

Decoding is PIL's; EXIF orientation is honoured; every mode (grayscale, RGBA, palette, CMYK, 16-bit) becomes
RGB. Resizing and cropping are what torchvision's weights.transforms() does (the form its published accuracies were
measured on, a PIL image: PIL's antialiased resize of the shorter side, then a centre crop), computed by
torchvision.transforms.v2's kernels on a uint8 tensor of the decoded pixels (runtime/transforms.py: the same
kernels without torchvision's import): within one level of PIL's own resize, 3x faster.

Two decode modes (contract.records.DECODE_MODES): "exact" decodes every pixel; "draft" lets libjpeg decode a
large JPEG at 1/2, 1/4 or 1/8 scale in the DCT domain (PIL's `draft`) as long as both sides stay at least
DRAFT_FACTOR times the resize, then resizes as usual. A 12 MP photo for a 232-pixel resize is decoded at
1008x756; anything smaller than twice that floor (and every other format) is decoded exactly. The export
measures what draft changes on real photos with the served artifact and records it (export/checks/decode.py).
"""

from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from contract.errors import ImageError, ImageProblem
from contract.policy import ACCEPTED_FORMATS
from contract.records import ImageContract, ResizeRule
from runtime import transforms  # torchvision's kernels without importing torchvision (a worker's start)

# Limits checked from the header before decoding, so a small file cannot expand into gigabytes.
MAX_PIXELS = 40_000_000  # 40 megapixels: any camera photo; a decompression bomb is far larger
MAX_SIDE = 12_000
MIN_SIDE = 8
DRAFT_FORMATS = ("JPEG", "MPO")  # libjpeg's DCT scaling: JPEG only
# Draft decoding keeps both sides >= 2x the resize: the antialiased resize then still averages at least two
# decoded pixels per output pixel, so the answer stays close to the exact one (measured per export, gated).
DRAFT_FACTOR = 2
EXIF_ORIENTATION = 0x0112
TURNED_SIDEWAYS = (5, 6, 7, 8)  # orientations that swap width and height


def decode_upright(data: bytes, draft_floor: int | None = None) -> Image.Image:
    """Bytes -> an RGB PIL image as a viewer shows it (EXIF orientation applied): what the served path
    preprocesses. With `draft_floor` (draft_floor(contract)), a large JPEG is decoded at a reduced scale that keeps
    both sides >= draft_floor; without it, every pixel is decoded."""
    image, tag = _decoded_rgb(data, draft_floor)
    return image.transpose(PIL_TURNS[tag]) if tag in PIL_TURNS else image


def decode_image(data: bytes, draft_floor: int | None = None) -> torch.Tensor:
    """Bytes -> uint8 tensor (3, H, W), RGB, upright: decode_upright's pixels as a tensor of their own."""
    return pixels(decode_upright(data, draft_floor)).clone()  # writable; still (H, W, C) in memory


def _decoded_rgb(data: bytes, draft_floor: int | None) -> tuple[Image.Image, int]:
    """(the RGB image as stored, its EXIF orientation), or the ImageError that says what is wrong with it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            check_header(image)
            image.seek(0)  # animated GIF/WebP: the first frame
            if draft_floor:
                reduce_in_dct(image, draft_floor)
            image.load()
            tag = orientation(image)  # EXIF and palettes are parsed here: corrupt ones are corrupt images too
            return to_rgb(image), tag
    except ImageError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageError(ImageProblem.TOO_LARGE,
                         f"image too large: more than {MAX_PIXELS:,} pixels; downscale it before sending") from None
    except UnidentifiedImageError:
        raise ImageError(ImageProblem.NOT_AN_IMAGE,
                         "body is not an image PIL can read; send JPEG, PNG, WebP, BMP or GIF") from None
    except MemoryError:
        raise  # the server's trouble, not the image's: passed on, never an ImageError
    except Exception as error:
        if not _raised_by_pil(error):
            raise  # our own bug (to_rgb, numpy calls of ours): passed on with its traceback, never an ImageError
        raise _corrupt(error) from None


# What PIL documents for a file it cannot parse; any other type it raises on untrusted bytes (TypeError,
# KeyError, IndexError, struct.error, ...; tests/runtime/test_decode_fuzz.py names the ones fuzzing found) is
# refused as corrupt the same way and logged with its type and place, since it marks a gap in PIL's own checks.
PIL_PARSE_ERRORS = (OSError, ValueError, SyntaxError)
_log = logging.getLogger(__name__)


def _raised_by_pil(error: BaseException) -> bool:
    """Whether PIL's code raised it: the innermost frame that is PIL's or this module's is PIL's (frames of
    the standard library or NumPy that PIL called are looked through)."""
    for module, _ in reversed(_frames(error)):
        if module == "PIL" or module.startswith("PIL."):
            return True
        if module == __name__:
            return False
    return False


def _frames(error: BaseException) -> list[tuple[str, str]]:
    """(module, file:line) of each frame of the error's traceback, outermost first."""
    frames, trace = [], error.__traceback__
    while trace is not None:
        frame = trace.tb_frame
        frames.append((frame.f_globals.get("__name__", ""), f"{frame.f_code.co_filename}:{trace.tb_lineno}"))
        trace = trace.tb_next
    return frames


def _corrupt(error: Exception) -> ImageError:
    said = str(error)
    if not isinstance(error, PIL_PARSE_ERRORS):
        said = f"{type(error).__name__}: {error}"
        _log.warning("PIL raised %s at %s on a corrupt image; refused as corrupt", type(error).__name__,
                     _frames(error)[-1][1])
    return ImageError(ImageProblem.CORRUPT,
                      f"image is corrupt or truncated: {said[:200]}; re-encode it as JPEG or PNG")


def shown_size(data: bytes) -> tuple[int, int]:
    """(width, height) as a viewer shows the image (EXIF orientation applied), from its header only."""
    image = Image.open(io.BytesIO(data))
    width, height = image.size
    return (height, width) if orientation(image) in TURNED_SIDEWAYS else (width, height)


def draft_floor(contract: ImageContract, decode: str | None = None) -> int | None:
    """The smallest side a draft decode may leave for this contract, or None to decode exactly. `decode`
    overrides the contract's mode (the handler's `decode: exact` setting)."""
    return DRAFT_FACTOR * contract.resize if (decode or contract.decode) == "draft" else None


def reduce_in_dct(image: Image.Image, floor: int) -> None:
    """Ask libjpeg for the largest DCT scaling (1/2, 1/4, 1/8) keeping both sides >= floor; a no-op for other
    formats and for images smaller than 2 * floor."""
    if image.format in DRAFT_FORMATS and min(image.size) >= 2 * floor:
        image.draft(None, (floor, floor))


def orientation(image: Image.Image) -> int:
    """The EXIF Orientation tag (1: stored upright)."""
    tag: int = image.getexif().get(EXIF_ORIENTATION, 1)  # PIL types EXIF values Any; read as exif_transpose does
    return tag


# EXIF orientation -> the PIL transpose that shows the image upright (ImageOps.exif_transpose's table)
PIL_TURNS = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
             5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
             8: Image.Transpose.ROTATE_90}


def upright(pixels: torch.Tensor, tag: int) -> torch.Tensor:
    """(H, W, C) as stored -> as a viewer shows it; the same pixels ImageOps.exif_transpose gives, turned as a
    tensor (one copy at most, where PIL's transpose is another full-size image)."""
    turned = {2: lambda t: t.flip(1), 3: lambda t: t.flip(0, 1), 4: lambda t: t.flip(0),
              5: lambda t: t.transpose(0, 1), 6: lambda t: t.transpose(0, 1).flip(1),
              7: lambda t: t.transpose(0, 1).flip(0, 1), 8: lambda t: t.transpose(0, 1).flip(0)}.get(tag)
    return turned(pixels) if turned else pixels


def check_header(image: Image.Image) -> None:
    if image.format not in ACCEPTED_FORMATS:
        raise ImageError(ImageProblem.UNSUPPORTED_FORMAT,
                         f"{image.format} images are not accepted; send JPEG, PNG, WebP, BMP or GIF")
    width, height = image.size
    if width * height > MAX_PIXELS or max(width, height) > MAX_SIDE:
        raise ImageError(ImageProblem.TOO_LARGE, f"image is {width}x{height}: the limit is {MAX_PIXELS:,} pixels "
                                                 f"and {MAX_SIDE} per side; downscale it before sending")
    if min(width, height) < MIN_SIDE:
        raise ImageError(ImageProblem.TOO_SMALL,
                         f"image is {width}x{height}: at least {MIN_SIDE} pixels per side are needed")


def to_rgb(image: Image.Image) -> Image.Image:
    """Any PIL mode to 8-bit RGB; transparency is composited on white (what a viewer shows)."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16/32-bit grayscale: scale to 8 bits, not clip
        array = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if image.mode.startswith("I;16") or array.max() > 255 else 255.0
        image = Image.fromarray(np.clip(array / peak * 255.0 + 0.5, 0, 255).astype(np.uint8), mode="L")
    if image.mode == "F":  # float TIFFs: [0, 1] data is scaled, anything else is taken as 0..255
        array = np.asarray(image, dtype=np.float64)
        scale = 255.0 if array.size and array.max() <= 1.0 else 1.0
        image = Image.fromarray(np.clip(array * scale + 0.5, 0, 255).astype(np.uint8), mode="L")
    if image.mode in ("P", "RGB", "L") and "transparency" in image.info:  # palette or colour-key transparency
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")  # RGB: no copy


def preprocess(image: torch.Tensor | Image.Image, contract: ImageContract) -> torch.Tensor:
    """An upright RGB image (PIL, or a uint8 tensor (3, H, W)) -> float32 (3, crop) in [0, 1], as torchvision's
    ImageClassification preset behind weights.transforms() makes it: resize of the shorter side with the contract's
    interpolation and antialias, centre crop, to float; normalisation is in the graph. The resize is
    torchvision.transforms.v2's: on the CPU a uint8 image stays uint8 through its vectorised fixed-point kernel,
    which computes PIL's antialiased filter (within one level of PIL's resize, the form torchvision's accuracies were
    measured on) 3x faster than PIL's own resize of the crop window alone (docs/results/2026-11-25-serving-overhead/analysis.md, third pass); on
    a GPU it runs in float32 and rounds, exactly as transforms() on that tensor."""
    if isinstance(image, Image.Image):
        image = pixels(image)
    image = transforms.resize(image, [contract.resize], contract.interpolation, contract.antialias)
    image = transforms.center_crop(image, list(contract.crop)).contiguous()  # PIL's pixels come channels-last: rows are CHW
    return transforms.to_float(image)


def resize_whole(image: torch.Tensor | Image.Image, rule: ResizeRule) -> torch.Tensor:
    """An upright RGB image -> float32 (3, H', W') in [0, 1], the whole image at the size its resize rule gives
    (a detector's or a segmenter's input; the model's own transform then changes nothing). The same antialiased
    bilinear uint8 resize as preprocess."""
    if isinstance(image, Image.Image):
        image = pixels(image)
    size = list(rule.size(image.shape[-2], image.shape[-1]))
    resized = transforms.resize(image, size, "bilinear", antialias=True).contiguous()
    return transforms.to_float(resized)


def pixels(image: Image.Image) -> torch.Tensor:
    """An RGB PIL image's pixels as a read-only uint8 tensor (3, H, W) over one copy (PIL's packed bytes), for
    preprocess to resize. torchvision's pil_to_tensor copies them again through np.array(copy=True), which takes
    10x as long on large images (6.7 vs 0.7 ms for a 1600x1200 screenshot, Pillow 13, NumPy 2)."""
    array = np.asarray(image)
    # torch warns (once a process) that a read-only array makes a read-only tensor; only the resize reads it. Set
    # per call, not at import: pytest and the export's warning log replace the filters a module set at import.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return torch.from_numpy(array).permute(2, 0, 1)
