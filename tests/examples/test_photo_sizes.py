"""examples/photo_sizes.py writes the bodies users send: each at its size and format, the 12 MP one stored
sideways with the EXIF tag that turns it, decoded upright by the handler's own decoder, byte-identical per seed."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from examples import photo_sizes
from export.checks import phone_photos
from runtime.images import decode_image


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("sizes")
    return out, photo_sizes.write_bodies(out, seed=0)


@pytest.mark.slow  # every body, the 12 MP one with grain among them
def test_every_body_is_written_at_its_size_and_format_and_indexed(written):
    out, index = written
    assert json.loads((out / photo_sizes.INDEX_FILE).read_text()) == index
    for row in index:
        image = Image.open(out / row["file"])
        assert image.format == row["format"] and list(image.size) == row["stored"]
        assert row["bytes"] == (out / row["file"]).stat().st_size
    sizes = {row["file"]: row for row in index}
    assert sizes["12mp-sideways.jpg"]["stored"] == [4032, 3024] and sizes["12mp-sideways.jpg"]["bytes"] > 1_000_000


@pytest.mark.slow
def test_the_sideways_photo_is_decoded_upright_by_the_handlers_decoder(written):
    out, _ = written
    data = (out / "12mp-sideways.jpg").read_bytes()
    assert Image.open(io.BytesIO(data)).getexif()[phone_photos.EXIF_ORIENTATION] == phone_photos.ROTATED_90_CW
    decoded = decode_image(data)
    assert tuple(decoded.shape) == (3, 4032, 3024)  # portrait, as the phone showed it
    body = next(b for b in photo_sizes.BODIES if b.sideways)
    upright = np.asarray(phone_photos.upright_photo(body.photo, body.shown, np.random.default_rng(0)), dtype=np.float32)
    shown = decoded.permute(1, 2, 0).numpy().astype(np.float32)
    turned_wrong = np.rot90(np.rot90(shown))  # the other way round would differ everywhere
    assert np.abs(shown - upright).mean() < 6 < np.abs(turned_wrong - upright).mean()


def test_the_same_seed_gives_the_same_bytes():
    body = photo_sizes.BODIES[0]
    first, second, other = (photo_sizes.encode(body, np.random.default_rng(seed)) for seed in (0, 0, 1))
    assert first == second != other
    assert tuple(decode_image(first).shape) == (3, 480, 640) and decode_image(first).dtype == torch.uint8
