"""Structure-aware, seeded mutations of image files, so that CI meets the same classes of malformed input every run.

Beside blind edits (bit flips, interesting bytes, truncations, cut and duplicated slices) each format's header
fields are found and edited: TIFF IFD entries (tag, type, count, value/offset, also inside JPEG EXIF and MPO's MP
index), PNG chunk lengths and IHDR fields (with the CRC made right again, so PIL reads past it), JPEG marker
codes, segment lengths and frame/scan headers, GIF screen and image descriptors and sub-block sizes, BMP header
fields, RIFF/WebP chunk sizes. `mutate(data, rng)` applies one to three of them; the same rng state gives the
same bytes.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

INTERESTING = {1: (0, 1, 2, 0x7F, 0x80, 0xFE, 0xFF),
               2: (0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF),
               4: (0, 1, 2, 0xFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)}
TIFF_TYPES = tuple(range(0, 19))  # 1..12 are TIFF 6's, 13 IFD, 16..18 BigTIFF's; 0 and the rest invalid
TIFF_TAGS = (256, 257, 258, 259, 262, 273, 274, 277, 278, 279, 284, 317, 320, 338, 339, 0x8769, 0xB000, 0xB001,
             0xB002)
JPEG_MARKERS = (0xC0, 0xC1, 0xC2, 0xC3, 0xC4, 0xC9, 0xCB, 0xCC, 0xD8, 0xD9, 0xDA, 0xDB, 0xDD, 0xE0, 0xE1, 0xE2,
                0xEE, 0xFE)
JPEG_FRAMES = (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF)
JPEG_STANDALONE = (0x01, 0xD8, *range(0xD0, 0xD8))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HEADER_BYTES = 10  # leading payload bytes of a chunk/segment edited one by one


@dataclass(frozen=True)
class Field:
    """An integer in the file worth editing; `crc` is (start, end) of the bytes a CRC at `end` covers."""
    offset: int
    size: int
    order: str = "big"
    values: tuple[int, ...] = ()
    crc: tuple[int, int] | None = None


def read(data: bytes | bytearray, offset: int, size: int, order: str) -> int:
    return int.from_bytes(data[offset:offset + size], order)


def payload(start: int, end: int, crc: tuple[int, int] | None = None) -> list[Field]:
    return [Field(offset, 1, crc=crc) for offset in range(start, min(end, start + HEADER_BYTES))]


# ---------------------------------------------------------------- TIFF (also EXIF and MPO's MP index)
def tiff_fields(data: bytes) -> list[Field]:
    fields = []
    for magic, order in ((b"II*\x00", "little"), (b"MM\x00*", "big")):
        base = data.find(magic)
        while base >= 0 and len(fields) < 400:
            fields += [Field(base + 4, 4, order, (8, len(data) - base))] + ifd_fields(data, base, order)
            base = data.find(magic, base + 4)
    return fields


def ifd_fields(data: bytes, base: int, order: str) -> list[Field]:
    fields, seen = [], set()
    offset = read(data, base + 4, 4, order)
    while 0 < offset and base + offset + 2 <= len(data) and offset not in seen and len(seen) < 4:
        seen.add(offset)
        start = base + offset
        count = read(data, start, 2, order)
        fields.append(Field(start, 2, order, (count + 1, count - 1)))
        fields += [f for i in range(min(count, 48)) for f in entry_fields(data, start + 2 + 12 * i, base, order)]
        next_at = start + 2 + 12 * count
        if next_at + 4 > len(data):
            break
        fields.append(Field(next_at, 4, order, (offset, len(data) - base)))
        offset = read(data, next_at, 4, order)
    return fields


def entry_fields(data: bytes, entry: int, base: int, order: str) -> list[Field]:
    if entry + 12 > len(data):
        return []
    value = read(data, entry + 8, 4, order)
    return [Field(entry, 2, order, TIFF_TAGS), Field(entry + 2, 2, order, TIFF_TYPES),
            Field(entry + 4, 4, order, (read(data, entry + 4, 4, order) + 1, 0x40000000)),
            Field(entry + 8, 4, order, (value + 1, value - 1, len(data) - base, len(data) - base - 1))]


# ---------------------------------------------------------------- PNG
def png_fields(data: bytes) -> list[Field]:
    fields, pos = [], len(PNG_MAGIC)
    while data.startswith(PNG_MAGIC) and pos + 12 <= len(data):
        length, kind = read(data, pos, 4, "big"), data[pos + 4:pos + 8]
        crc = (pos + 4, pos + 8 + length)
        fields.append(Field(pos, 4, "big", (length + 1, length - 1, len(data) - pos)))
        fields.append(Field(pos + 4, 4, "big", (0x49444154, 0x49454E44, 0x74524E53, 0x504C5445, 0x65584966,
                                                  0x6163544C, 0x6663544C, 0x66644154), crc=None))
        if kind == b"IHDR":
            fields += [Field(pos + 8, 4, crc=crc), Field(pos + 12, 4, crc=crc),  # width, height
                       Field(pos + 16, 1, "big", (1, 2, 4, 8, 16), crc),  # bit depth
                       Field(pos + 17, 1, "big", (0, 2, 3, 4, 6), crc),  # colour type
                       *payload(pos + 18, pos + 21, crc)]  # compression, filter, interlace
        elif kind != b"IDAT":
            fields += payload(pos + 8, pos + 8 + length, crc)
        pos += 12 + length
    return fields


# ---------------------------------------------------------------- JPEG (and MPO's first image)
def jpeg_fields(data: bytes) -> list[Field]:
    fields, pos = [], 2
    while data.startswith(b"\xff\xd8") and pos + 4 <= len(data) and len(fields) < 400:
        if data[pos] != 0xFF:
            pos = skip_entropy_data(data, pos)
            continue
        marker = data[pos + 1]
        fields.append(Field(pos + 1, 1, "big", JPEG_MARKERS))
        if marker in JPEG_STANDALONE or marker == 0xFF:
            pos += 2 if marker != 0xFF else 1
            continue
        if marker == 0xD9:
            break
        length = read(data, pos + 2, 2, "big")
        fields.append(Field(pos + 2, 2, "big", (0, 1, 2, length - 1, length + 1)))
        fields += frame_fields(pos + 4) if marker in JPEG_FRAMES else payload(pos + 4, pos + 2 + length)
        pos += 2 + length
    return fields


def frame_fields(start: int) -> list[Field]:
    """SOFn: precision, height, width, component count, then each component's id, sampling and table."""
    return [Field(start, 1, "big", (8, 12, 16)), Field(start + 1, 2), Field(start + 3, 2),
            Field(start + 5, 1, "big", (1, 3, 4)), *payload(start + 6, start + 6 + 9)]


def skip_entropy_data(data: bytes, pos: int) -> int:
    """The next marker after scan data (0xFF00 stuffing and RSTn belong to the scan)."""
    while pos + 1 < len(data):
        if data[pos] == 0xFF and data[pos + 1] not in (0x00, 0xFF, *range(0xD0, 0xD8)):
            return pos
        pos += 1
    return len(data)


# ---------------------------------------------------------------- GIF, BMP, RIFF/WebP
def gif_fields(data: bytes) -> list[Field]:
    if not data.startswith(b"GIF8") or len(data) < 13:
        return []
    fields = [Field(6, 2, "little"), Field(8, 2, "little"), Field(10, 1), Field(11, 1)]
    pos = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)
    while pos < len(data) and data[pos] != 0x3B and len(fields) < 200:
        if data[pos] == 0x2C and pos + 10 <= len(data):
            fields += [Field(pos + 1 + 2 * i, 2, "little") for i in range(4)] + [Field(pos + 9, 1)]
            packed = data[pos + 9]
            pos += 10 + (3 << ((packed & 7) + 1) if packed & 0x80 else 0)
            fields.append(Field(pos, 1, "big", (0, 1, 2, 8, 11, 12)))  # LZW minimum code size
            pos += 1
        else:
            fields.append(Field(pos + 1, 1))  # extension label
            pos += 2
        pos = sub_blocks(data, pos, fields)
    return fields


def sub_blocks(data: bytes, pos: int, fields: list[Field]) -> int:
    while pos < len(data) and data[pos] != 0:
        fields.append(Field(pos, 1))
        pos += 1 + data[pos]
    return pos + 1


BMP_HEADER = ((2, 4), (10, 4), (14, 4), (18, 4), (22, 4), (26, 2), (28, 2), (30, 4), (34, 4), (46, 4), (50, 4))
BMP_VALUES = {28: (1, 2, 4, 8, 15, 16, 24, 32, 64), 30: (0, 1, 2, 3, 4, 5, 6, 11), 14: (12, 40, 52, 56, 64, 108, 124)}


def bmp_fields(data: bytes) -> list[Field]:
    if not data.startswith(b"BM"):
        return []
    return [Field(offset, size, "little", BMP_VALUES.get(offset, ())) for offset, size in BMP_HEADER
            if offset + size <= len(data)]


def riff_fields(data: bytes) -> list[Field]:
    if not data.startswith(b"RIFF") or data[8:12] != b"WEBP":
        return []
    fields, pos = [Field(4, 4, "little", (len(data) - 8,))], 12
    while pos + 8 <= len(data) and len(fields) < 200:
        size = read(data, pos + 4, 4, "little")
        fields.append(Field(pos + 4, 4, "little", (size + 1, size - 1, len(data) - pos)))
        fields += payload(pos + 8, pos + 8 + size)
        pos += 8 + size + (size & 1)
    return fields


FIELD_FINDERS = (tiff_fields, png_fields, jpeg_fields, gif_fields, bmp_fields, riff_fields)


def fields(data: bytes) -> list[Field]:
    return [field for finder in FIELD_FINDERS for field in finder(data)]


# ---------------------------------------------------------------- mutations
def edit_field(data: bytearray, field: Field, rng: random.Random) -> None:
    if field.offset + field.size > len(data):
        return
    current = read(data, field.offset, field.size, field.order)
    choices = field.values if field.values and rng.random() < 0.6 else INTERESTING[field.size]
    value = rng.choice((*choices, current + 1, current - 1, rng.getrandbits(8 * field.size)))
    data[field.offset:field.offset + field.size] = (value % (1 << 8 * field.size)).to_bytes(field.size, field.order)
    if field.crc and field.crc[1] + 4 <= len(data):
        start, end = field.crc
        data[end:end + 4] = zlib.crc32(bytes(data[start:end])).to_bytes(4, "big")


def blind_edit(data: bytearray, rng: random.Random) -> None:
    at = rng.randrange(len(data))
    kind = rng.randrange(5)
    if kind == 0:
        data[at] ^= 1 << rng.randrange(8)
    elif kind == 1:
        data[at] = rng.choice(INTERESTING[1])
    elif kind == 2:
        del data[max(1, int(len(data) * rng.random() ** 0.3)):]  # truncation, mostly near the end
    elif kind == 3:
        del data[at:at + rng.randint(1, 16)]
    else:
        data[at:at] = data[at:at + rng.randint(1, 64)]


def mutate(data: bytes, rng: random.Random, max_size: int | None = None) -> bytes:
    """One to three edits, each a header field (when the format has any) or a blind one, 2 to 1."""
    out = bytearray(data)
    for _ in range(1 + (rng.random() < 0.35) + (rng.random() < 0.15)):
        found = fields(bytes(out)) if out else []
        if found and rng.random() < 2 / 3:
            edit_field(out, rng.choice(found), rng)
        elif out:
            blind_edit(out, rng)
    return bytes(out[:max_size] if max_size else out)
