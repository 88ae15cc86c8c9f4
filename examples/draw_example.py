"""Draws examples/cat.jpg: a cartoon cat made from shapes, so the repository's example image is license-clean.

Run: python examples/draw_example.py  (the committed cat.jpg was made this way)
"""

from pathlib import Path

from PIL import Image, ImageDraw, ImageFilter

SIZE = (640, 480)


def draw_cat() -> Image.Image:
    image = Image.new("RGB", SIZE, (170, 200, 230))
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, 360, 640, 480], fill=(120, 160, 90))  # grass
    fur, dark = (205, 140, 70), (120, 75, 35)
    draw.ellipse([190, 220, 470, 430], fill=fur)  # body
    draw.ellipse([230, 110, 410, 270], fill=fur)  # head
    draw.polygon([(240, 150), (255, 70), (300, 125)], fill=fur)  # ears
    draw.polygon([(400, 150), (385, 70), (340, 125)], fill=fur)
    for x in (270, 345):  # eyes
        draw.ellipse([x, 165, x + 28, 195], fill=(90, 160, 60))
        draw.ellipse([x + 10, 168, x + 18, 192], fill=(10, 10, 10))
    draw.polygon([(313, 210), (327, 210), (320, 220)], fill=(230, 120, 130))  # nose
    for dy in (-6, 4, 14):  # whiskers
        draw.line([(318, 222), (240, 215 + dy)], fill=(60, 40, 30), width=2)
        draw.line([(322, 222), (400, 215 + dy)], fill=(60, 40, 30), width=2)
    for x in range(220, 450, 35):  # tabby stripes
        draw.arc([x - 20, 240, x + 20, 330], 200, 340, fill=dark, width=6)
    draw.arc([430, 280, 560, 420], 180, 300, fill=fur, width=22)  # tail
    return image.filter(ImageFilter.GaussianBlur(1.2))


if __name__ == "__main__":
    target = Path(__file__).with_name("cat.jpg")
    draw_cat().save(target, quality=90)
    print(f"wrote {target}")
