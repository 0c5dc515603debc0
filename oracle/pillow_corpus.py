"""What transformers' `load_image` makes of every JPEG/PNG/WebP/GIF/BMP/TIFF test image in Pillow's own source package.

Run by hand: python oracle/pillow_corpus.py models/pillow-images
(models/pillow-images is what .ci/run extracts from Pillow 13.0.0's source package: Tests/images, those formats only.)
Writes Tests/Fixtures/pillow-corpus/verdicts.json: for each file (path relative to the corpus), either the width,
height and SHA-256 of `ImageOps.exif_transpose(Image.open(f)).convert("RGB")`'s bytes, or "refused" with Pillow's
exception, plus the format and mode Pillow opened it as (null when it could not open it).
"""
import hashlib
import json
import os
import sys
import warnings

from PIL import Image, ImageOps

EXTENSIONS = (".png", ".apng", ".jpg", ".webp", ".gif", ".bmp", ".dib", ".tif", ".tiff")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Tests", "Fixtures", "pillow-corpus")


def verdict(path):
    entry = {"format": None, "mode": None}
    try:
        # load_image's steps (transformers/image_utils.py): open, exif_transpose, convert("RGB").
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            im = Image.open(path)
            entry["format"], entry["mode"] = im.format, im.mode
            rgb = ImageOps.exif_transpose(im).convert("RGB")
    except Exception as error:  # every exception is a refusal: load_image lets it through
        entry["refused"] = f"{type(error).__name__}: {error}"[:200]
        return entry
    entry.update(width=rgb.width, height=rgb.height, sha256=hashlib.sha256(rgb.tobytes()).hexdigest())
    return entry


def main(corpus):
    files = []
    for root, _, names in os.walk(corpus):
        for name in names:
            if name.lower().endswith(EXTENSIONS):
                files.append(os.path.relpath(os.path.join(root, name), corpus))
    table = []
    for file in sorted(files):
        table.append({"file": file, **verdict(os.path.join(corpus, file))})
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "verdicts.json"), "w") as f:
        json.dump({"pillow": Image.__version__, "files": table}, f, indent=0)
        f.write("\n")
    refused = sum("refused" in entry for entry in table)
    print(f"{len(table)} files, {refused} refused by Pillow {Image.__version__}")


if __name__ == "__main__":
    main(sys.argv[1])
