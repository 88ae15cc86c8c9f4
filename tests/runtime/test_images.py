"""runtime/images.py: image bytes -> RGB uint8 tensor -> model input; every image it refuses is an ImageError
saying what is wrong (the HTTP status each problem gets is handlers' business: tests/handlers/test_request_body.py).

Every image is made with PIL in memory; nothing is read from disk and nothing is mocked.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from contract.errors import VisionExportError
from contract.records import ContractError, ImageContract, InputRecord
from runtime.images import MAX_PIXELS, MAX_SIDE, MIN_SIDE, ImageError, ImageProblem, decode_image, preprocess

RED, GREEN, BLUE = (255, 0, 0), (0, 255, 0), (0, 0, 255)


def encode(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def solid(colour=(10, 200, 30), size=(16, 16), mode="RGB") -> Image.Image:
    return Image.new(mode, size, colour)


def pixel(tensor: torch.Tensor, x: int, y: int) -> list[int]:
    return tensor[:, y, x].tolist()


def close(actual, expected, tolerance: int) -> bool:
    return all(abs(int(a) - int(e)) <= tolerance for a, e in zip(actual, expected, strict=True))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height but which carries almost no pixel data (a bomb's header)."""
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))



# ---------------------------------------------------------------- decode_image(): formats
@pytest.mark.parametrize("fmt, options, tolerance", [
    ("JPEG", {"quality": 95}, 6),
    ("PNG", {}, 0),
    ("WEBP", {"lossless": True}, 0),
    ("WEBP", {"quality": 90}, 10),
    ("BMP", {}, 0),
    ("GIF", {}, 0),
    ("TIFF", {}, 0),
    ("TIFF", {"compression": "tiff_lzw"}, 0),
], ids=["jpeg", "png", "webp-lossless", "webp-lossy", "bmp", "gif", "tiff", "tiff-lzw"])
def test_decode_formats(fmt, options, tolerance):
    colour = (200, 40, 120) if fmt != "GIF" else RED  # GIF quantises to a palette: use an exact colour
    tensor = decode_image(encode(solid(colour, size=(30, 20)), fmt, **options))
    assert tensor.dtype == torch.uint8
    assert tuple(tensor.shape) == (3, 20, 30)
    for x, y in [(0, 0), (29, 19), (15, 10)]:
        assert close(pixel(tensor, x, y), colour, tolerance), (pixel(tensor, x, y), colour)


@pytest.mark.parametrize("fmt, options", [
    ("GIF", {"duration": 100, "loop": 0}),
    ("WEBP", {"duration": 100, "lossless": True}),
    ("PNG", {"duration": 100}),  # APNG
])
def test_decode_animated_first_frame(fmt, options):
    first, second, third = solid(RED), solid(BLUE), solid(GREEN)
    data = encode(first, fmt, save_all=True, append_images=[second, third], **options)
    assert getattr(Image.open(io.BytesIO(data)), "n_frames", 1) == 3
    tensor = decode_image(data)
    assert tuple(tensor.shape) == (3, 16, 16)
    assert pixel(tensor, 0, 0) == list(RED) and pixel(tensor, 15, 15) == list(RED)


def test_decode_exif_orientation_6():
    image = solid(RED, size=(40, 20))  # 40 wide, 20 tall: left half red, right half blue
    image.paste(BLUE, (20, 0, 40, 20))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise for display: the left half ends up on top
    data = encode(image, "JPEG", exif=exif, quality=95)

    reference = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    assert reference.size == (20, 40)
    assert close(reference.getpixel((10, 5)), RED, 8) and close(reference.getpixel((10, 35)), BLUE, 8)

    tensor = decode_image(data)
    assert tuple(tensor.shape) == (3, 40, 20)  # H=40, W=20
    assert close(pixel(tensor, 10, 5), RED, 8)  # top half red
    assert close(pixel(tensor, 10, 35), BLUE, 8)  # bottom half blue
    assert close(pixel(tensor, 0, 0), RED, 8) and close(pixel(tensor, 19, 39), BLUE, 8)
    expected = torch.from_numpy(np.array(reference.convert("RGB"))).permute(2, 0, 1)
    assert torch.equal(tensor, expected)


@pytest.mark.parametrize("orientation, size, top_left", [
    (1, (40, 20), RED),
    (3, (40, 20), BLUE),  # 180 degrees: blue is now on the left
    (8, (20, 40), BLUE),  # 90 degrees counter-clockwise: the right half (blue) goes on top
])
def test_decode_other_exif_orientations(orientation, size, top_left):
    image = solid(RED, size=(40, 20))
    image.paste(BLUE, (20, 0, 40, 20))
    exif = Image.Exif()
    exif[0x0112] = orientation
    tensor = decode_image(encode(image, "JPEG", exif=exif, quality=95))
    assert tuple(tensor.shape) == (3, size[1], size[0])
    assert close(pixel(tensor, 2, 2), top_left, 8)


# ---------------------------------------------------------------- decode_image(): modes
def test_mode_L_grayscale():
    image = Image.new("L", (16, 16), 77)
    image.putpixel((3, 4), 200)
    tensor = decode_image(encode(image))
    assert pixel(tensor, 0, 0) == [77, 77, 77]
    assert pixel(tensor, 3, 4) == [200, 200, 200]


def test_mode_RGBA_transparency_on_white():
    image = Image.new("RGBA", (16, 16), (10, 20, 30, 255))
    image.putpixel((0, 0), (0, 0, 0, 0))  # fully transparent black: a viewer shows white
    image.putpixel((1, 0), (0, 0, 0, 128))  # half transparent black: mid grey
    tensor = decode_image(encode(image))
    assert pixel(tensor, 0, 0) == [255, 255, 255]
    assert pixel(tensor, 5, 5) == [10, 20, 30]
    assert close(pixel(tensor, 1, 0), (127, 127, 127), 1)


def test_mode_LA_transparency_on_white():
    image = Image.new("LA", (16, 16), (40, 255))
    image.putpixel((0, 0), (0, 0))
    data = encode(image)
    assert Image.open(io.BytesIO(data)).mode == "LA"
    tensor = decode_image(data)
    assert pixel(tensor, 0, 0) == [255, 255, 255]
    assert pixel(tensor, 8, 8) == [40, 40, 40]


@pytest.mark.parametrize("fmt", ["PNG", "GIF"])
def test_mode_P_palette(fmt):
    image = Image.new("P", (16, 16), 1)
    image.putpalette([0, 0, 0, 250, 100, 5, 20, 30, 240] + [0] * (256 * 3 - 9))
    image.putpixel((0, 0), 2)
    data = encode(image, fmt)
    assert Image.open(io.BytesIO(data)).mode == "P"
    tensor = decode_image(data)
    assert pixel(tensor, 5, 5) == [250, 100, 5]
    assert pixel(tensor, 0, 0) == [20, 30, 240]


@pytest.mark.parametrize("fmt", ["PNG", "GIF"])
def test_mode_P_palette_transparency_on_white(fmt):
    image = Image.new("P", (16, 16), 1)
    image.putpalette([0, 0, 0, 250, 100, 5] + [0] * (256 * 3 - 6))
    image.putpixel((0, 0), 0)
    data = encode(image, fmt, transparency=0)  # index 0 (black) is transparent
    opened = Image.open(io.BytesIO(data))
    assert opened.mode == "P" and "transparency" in opened.info
    tensor = decode_image(data)
    assert pixel(tensor, 0, 0) == [255, 255, 255]
    assert pixel(tensor, 5, 5) == [250, 100, 5]


@pytest.mark.parametrize("mode, colour", [("RGB", (0, 255, 0)), ("L", 7)])
def test_colour_key_transparency_on_white(mode, colour):
    image = Image.new(mode, (16, 16), colour)
    image.putpixel((5, 5), (10, 20, 30) if mode == "RGB" else 99)
    data = encode(image, transparency=colour)
    assert Image.open(io.BytesIO(data)).info["transparency"] == colour
    tensor = decode_image(data)
    assert pixel(tensor, 5, 5) == ([10, 20, 30] if mode == "RGB" else [99, 99, 99])
    assert pixel(tensor, 0, 0) == [255, 255, 255]


@pytest.mark.parametrize("fmt", ["JPEG", "TIFF"])
def test_mode_CMYK(fmt):
    data = encode(Image.new("CMYK", (16, 16), (255, 0, 0, 0)), fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    r, g, b = pixel(decode_image(data), 8, 8)
    assert r <= 10 and g >= 245 and b >= 245  # pure cyan


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_16_bit_grayscale_is_scaled_not_clipped(fmt):
    array = np.zeros((16, 16), dtype=np.uint16)
    array[:, :4], array[:, 4:8], array[:, 8:12], array[:, 12:] = 65535, 32768, 257, 0
    data = encode(Image.fromarray(array), fmt)
    assert Image.open(io.BytesIO(data)).mode.startswith("I;16")
    tensor = decode_image(data)
    assert pixel(tensor, 0, 0) == [255, 255, 255]
    assert close(pixel(tensor, 5, 0), (128, 128, 128), 1)
    assert pixel(tensor, 9, 0) == [1, 1, 1]
    assert pixel(tensor, 13, 0) == [0, 0, 0]


def test_mode_1_bilevel():
    image = Image.new("1", (16, 16), 0)
    image.putpixel((2, 3), 1)
    data = encode(image)
    assert Image.open(io.BytesIO(data)).mode == "1"
    tensor = decode_image(data)
    assert pixel(tensor, 0, 0) == [0, 0, 0]
    assert pixel(tensor, 2, 3) == [255, 255, 255]


@pytest.mark.parametrize("mode, colour", [("RGB", (1, 2, 3)), ("L", 9), ("RGBA", (4, 5, 6, 255)), ("P", 0)])
def test_every_mode_gives_uint8_rgb(mode, colour):
    tensor = decode_image(encode(Image.new(mode, (12, 9), colour)))
    assert tensor.dtype == torch.uint8 and tuple(tensor.shape) == (3, 9, 12)
    # pixels stay as decoded (H, W, C) in memory, seen as (C, H, W): no transposing copy; resize reads both
    assert tensor.permute(1, 2, 0).is_contiguous()


# ---------------------------------------------------------------- decode_image(): limits and bad input
def expect_refused(data: bytes, problem: ImageProblem) -> ImageError:
    with pytest.raises(ImageError) as caught:
        decode_image(data)
    assert caught.value.problem is problem, caught.value.message
    return caught.value


@pytest.fixture
def pixel_loads(monkeypatch) -> list:
    """Every call of PIL's pixel decoding (ImageFile.load), still decoding: refused-before-decode means none."""
    from PIL import ImageFile
    calls, load = [], ImageFile.ImageFile.load

    def counted(self, *args, **kwargs):
        calls.append(self.size)
        return load(self, *args, **kwargs)

    monkeypatch.setattr(ImageFile.ImageFile, "load", counted)
    return calls


def test_pixel_loads_sees_a_decode(pixel_loads):
    decode_image(encode(Image.new("L", (MIN_SIDE, MIN_SIDE), 50)))
    assert pixel_loads and set(pixel_loads) == {(MIN_SIDE, MIN_SIDE)}  # (PIL calls load again, a no-op)


def test_more_than_max_pixels_is_too_large_before_any_pixel_is_decoded(pixel_loads):
    assert 8000 * 6000 > MAX_PIXELS and max(8000, 6000) <= MAX_SIDE
    data = encode(Image.new("1", (8000, 6000)), compress_level=9)
    error = expect_refused(data, ImageProblem.TOO_LARGE)
    assert pixel_loads == []
    assert "8000x6000" in error.message and "downscale" in error.message


def test_more_than_max_side_is_too_large():
    data = encode(Image.new("1", (MAX_SIDE + 1, MIN_SIDE)))
    error = expect_refused(data, ImageProblem.TOO_LARGE)
    assert f"{MAX_SIDE + 1}x{MIN_SIDE}" in error.message and "downscale" in error.message
    error = expect_refused(encode(Image.new("1", (MIN_SIDE, MAX_SIDE + 1))), ImageProblem.TOO_LARGE)
    assert "downscale" in error.message


def test_exactly_max_side_is_accepted():
    tensor = decode_image(encode(Image.new("L", (MAX_SIDE, MIN_SIDE), 50)))
    assert tuple(tensor.shape) == (3, MIN_SIDE, MAX_SIDE) and pixel(tensor, MAX_SIDE - 1, 0) == [50, 50, 50]


@pytest.mark.parametrize("width, height", [(7000, 6000), (12000, 12000), (100_000, 100_000), (2**31 - 1, 2)])
def test_header_only_bombs_are_too_large_before_decoding(width, height, pixel_loads):
    expect_refused(png_header_only(width, height), ImageProblem.TOO_LARGE)
    assert pixel_loads == []


@pytest.mark.parametrize("size", [(MIN_SIDE - 1, 20), (20, MIN_SIDE - 1), (1, 1)])
def test_smaller_than_min_side_is_too_small(size):
    error = expect_refused(encode(solid(size=size)), ImageProblem.TOO_SMALL)
    assert f"{size[0]}x{size[1]}" in error.message and f"at least {MIN_SIDE}" in error.message


def test_min_side_is_accepted():
    assert tuple(decode_image(encode(solid(size=(MIN_SIDE, MIN_SIDE)))).shape) == (3, MIN_SIDE, MIN_SIDE)


@pytest.mark.parametrize("data", [b"hello, this is not an image at all" * 4, b"", b"\x00" * 100,
                                  b"\x89PNG\r\n\x1a\n"], ids=["text", "empty", "zeros", "png-magic-only"])
def test_garbage_is_not_an_image(data):
    error = expect_refused(data, ImageProblem.NOT_AN_IMAGE)
    assert "JPEG" in error.message and "PNG" in error.message


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_truncated_is_corrupt(fmt):
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    data = encode(Image.fromarray(noise), fmt)
    error = expect_refused(data[: len(data) // 2], ImageProblem.CORRUPT)
    assert "corrupt or truncated" in error.message


@pytest.mark.parametrize("fmt", ["PPM", "ICO", "TGA", "PCX"])
def test_readable_but_unaccepted_format_is_unsupported(fmt):
    data = encode(solid(size=(16, 16)), fmt)
    assert Image.open(io.BytesIO(data)).format == fmt  # PIL can read it; the handler refuses it
    error = expect_refused(data, ImageProblem.UNSUPPORTED_FORMAT)
    assert fmt in error.message and "send JPEG" in error.message


# ---------------------------------------------------------------- preprocess()
RESNET18_CONTRACT = ImageContract(resize=256, crop=(224, 224))  # torchvision's ResNet18 weights: 256 -> 224


def preprocess_224(image):
    return preprocess(image, RESNET18_CONTRACT)


@pytest.mark.parametrize("size", [(512, 256), (256, 512), (640, 480), (300, 1000), (MIN_SIDE, MIN_SIDE),
                                  (MIN_SIDE, 50)], ids=["landscape-2to1", "portrait-1to2", "landscape",
                                                        "portrait", "tiny", "tiny-thin"])
def test_preprocess_shape_dtype_range(size):
    colour = (255, 0, 128)
    tensor = preprocess_224(decode_image(encode(solid(colour, size=size))))
    assert tensor.dtype == torch.float32 and tuple(tensor.shape) == (3, 224, 224)
    assert float(tensor.min()) >= 0.0 and float(tensor.max()) <= 1.0
    expected = torch.tensor(colour, dtype=torch.float32).div(255).view(3, 1, 1).expand(3, 224, 224)
    assert torch.allclose(tensor, expected, atol=1 / 255)


def test_preprocess_centre_crops_landscape():
    image = solid(BLUE, size=(512, 256))  # shorter side already 256: crop keeps columns 144..367
    image.paste(RED, (0, 0, 128, 256))
    image.paste(RED, (384, 0, 512, 256))
    tensor = preprocess_224(decode_image(encode(image)))
    assert torch.allclose(tensor, torch.tensor([0.0, 0.0, 1.0]).view(3, 1, 1).expand(3, 224, 224))


def test_preprocess_centre_crops_portrait():
    image = solid(BLUE, size=(256, 512))  # crop keeps rows 144..367
    image.paste(RED, (0, 0, 256, 128))
    image.paste(RED, (0, 384, 256, 512))
    tensor = preprocess_224(decode_image(encode(image)))
    assert torch.allclose(tensor, torch.tensor([0.0, 0.0, 1.0]).view(3, 1, 1).expand(3, 224, 224))


def test_preprocess_resizes_shorter_side_to_256():
    # 1024x512 -> 512x256; a red block over x in [0, 512) of the original maps to [0, 256) and
    # the crop [144, 368) shows red on its left 112 columns and blue on the rest
    image = solid(BLUE, size=(1024, 512))
    image.paste(RED, (0, 0, 512, 512))
    tensor = preprocess_224(decode_image(encode(image)))
    assert torch.allclose(tensor[:, :, 100], torch.tensor([1.0, 0.0, 0.0]).view(3, 1).expand(3, 224), atol=0.01)
    assert torch.allclose(tensor[:, :, 124], torch.tensor([0.0, 0.0, 1.0]).view(3, 1).expand(3, 224), atol=0.01)


def test_preprocess_follows_the_contracts_resize_and_crop():
    # 1024x512 -> shorter side 232 -> 464x232; centre crop 200x100 keeps columns 132..332 and rows 66..166;
    # red covers x < 232 after the resize, so crop columns left of 100 are red and right of it blue (away from the antialiased edge)
    image = solid(BLUE, size=(1024, 512))
    image.paste(RED, (0, 0, 512, 512))
    tensor = preprocess(decode_image(encode(image)), ImageContract(resize=232, crop=(100, 200)))
    assert tuple(tensor.shape) == (3, 100, 200)
    assert torch.allclose(tensor[:, :, 94], torch.tensor([1.0, 0.0, 0.0]).view(3, 1).expand(3, 100), atol=0.02)
    assert torch.allclose(tensor[:, :, 106], torch.tensor([0.0, 0.0, 1.0]).view(3, 1).expand(3, 100), atol=0.02)


def test_contract_from_the_manifest_record_and_its_absence():
    record = {"resize": 232, "crop": [224, 224], "interpolation": "bilinear", "antialias": True}
    assert InputRecord((1, 3, 224, 224), preprocessing=record).image_contract() == ImageContract(232, (224, 224))
    with pytest.raises(ContractError, match="no RGB image input"):
        InputRecord((1, 3, 224, 224)).image_contract()


def test_image_error_is_in_the_family_and_says_what_is_wrong():
    error = ImageError(ImageProblem.TOO_SMALL, "image is 1x1")
    assert isinstance(error, VisionExportError)
    assert error.problem is ImageProblem.TOO_SMALL and error.message == str(error) == "image is 1x1"
