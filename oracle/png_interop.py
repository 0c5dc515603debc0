"""Pillow's reading of PNG files SwiftVLM's encoder wrote: Tests/Fixtures/images/written/{gray,rgb,rgba}.png.

The Swift test PNGEncodingTests writes these files from a fixed pattern (run it once with VLM_WRITE_PNG_FIXTURES=1
after changing the encoder) and checks on every run that the encoder still writes them byte for byte. This script
opens each with Pillow, checks its mode and size, that its pixels are the pattern, and stores the SHA-256 of what
Pillow decoded in written/pillow.json, which the Swift test compares with the pattern's.

Run: python oracle/png_interop.py
"""
import hashlib
import json
import os

from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Tests", "Fixtures", "images", "written")
WIDTH, HEIGHT = 29, 17
MODES = {"gray": ("L", 1), "rgb": ("RGB", 3), "rgba": ("RGBA", 4)}


def pattern(channels):
    """Sample c of pixel (x, y): the same formula as PNGEncodingTests.pattern."""
    return bytes((x * 37 + y * 11 + c * 85 + (x * y) % 7) % 256
                 for y in range(HEIGHT) for x in range(WIDTH) for c in range(channels))


def main():
    decoded = {}
    for name, (mode, channels) in MODES.items():
        with Image.open(os.path.join(OUT, f"{name}.png")) as image:
            image.load()
            assert image.format == "PNG" and image.mode == mode and image.size == (WIDTH, HEIGHT), (name, image.mode, image.size)
            pixels = image.tobytes()
        assert pixels == pattern(channels), f"{name}.png: Pillow reads other pixels than the pattern"
        decoded[name] = {"mode": mode, "width": WIDTH, "height": HEIGHT, "sha256": hashlib.sha256(pixels).hexdigest()}
    with open(os.path.join(OUT, "pillow.json"), "w") as f:
        json.dump(decoded, f, indent=1, sort_keys=True)
    print(decoded)


if __name__ == "__main__":
    main()
