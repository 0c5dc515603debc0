"""Fixtures for VLMImagesTests: images in every mode/format Pillow opens, and what Pillow/transformers make of them.

Run by hand: python oracle/images.py
Writes Tests/Fixtures/images/: image files, manifest.json (decode/resize expectations as SHA-256 of the RGB bytes),
CLIP configs and pixel_values as little-endian float32 .f32 files.

    python oracle/images.py processors

rewrites only the "processors" cases: checkpoint-like directories (processors/<case>/) whose image processor
transformers' AutoImageProcessor chooses (backend="pil") from image_processor_type, its Fast/Pil suffixes, an old
feature_extractor_type, processor_config.json's nested "image_processor" or config.json's model_type, with the
pixel_values it makes of real photos.
"""
import hashlib
import io
import json
import os
import shutil
import struct
import zlib

import numpy as np
from PIL import Image, ImageOps
import sys

from transformers import AutoImageProcessor, CLIPImageProcessorPil
from transformers.image_utils import load_image

PHOTOS = "/work/data/photos"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "Tests", "Fixtures", "images")


def sha(data):
    return hashlib.sha256(data).hexdigest()


def write_png(name, width, height, bit_depth, color_type, samples, plte=None, trns=None, exif=None):
    """A PNG written by hand, for the layouts Pillow cannot save (16-bit colour, 2/4-bit grey, short palettes).

    samples: uint8/uint16 array (height, width * channels); packed here to bit_depth.
    """
    rows = []
    for row in samples:
        if bit_depth == 16:
            raw = row.astype(">u2").tobytes()
        elif bit_depth == 8:
            raw = row.astype(np.uint8).tobytes()
        else:
            per_byte = 8 // bit_depth
            padded = np.zeros(-(-len(row) // per_byte) * per_byte, dtype=np.uint8)
            padded[: len(row)] = row
            packed = np.zeros(len(padded) // per_byte, dtype=np.uint8)
            for i in range(per_byte):
                packed |= (padded[i::per_byte] << (8 - bit_depth * (i + 1))).astype(np.uint8)
            raw = packed.tobytes()
        rows.append(b"\x00" + raw)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0))
    if plte is not None:
        png += chunk(b"PLTE", bytes(plte))
    if trns is not None:
        png += chunk(b"tRNS", bytes(trns))
    if exif is not None:
        png += chunk(b"eXIf", exif)
    png += chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b"")
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(png)


def exif_with_orientation(orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


def make_decode_fixtures():
    chelsea = Image.open(os.path.join(PHOTOS, "chelsea.png")).convert("RGB")
    coffee = Image.open(os.path.join(PHOTOS, "coffee.png")).convert("RGB")
    patch = chelsea.crop((180, 60, 241, 107))  # 61x47: odd sizes catch stride and chroma-edge mistakes
    big_patch = coffee.crop((100, 50, 277, 183))  # 177x133 for JPEG/WebP, where block edges matter
    rgba = patch.copy()
    rgba.putalpha(Image.fromarray((np.arange(61 * 47).reshape(47, 61) * 7 % 256).astype(np.uint8)))
    big_rgba = big_patch.copy()
    big_rgba.putalpha(Image.fromarray((np.arange(177 * 133).reshape(133, 177) % 251).astype(np.uint8)))
    grey = patch.convert("L")
    save = lambda im, name, **kw: im.save(os.path.join(OUT, name), **kw)

    # PNG, each mode Pillow saves.
    save(patch, "rgb8.png")
    save(grey, "grey8.png")
    save(grey.convert("1"), "grey1.png")
    save(patch.convert("LA"), "greyalpha8.png")
    save(rgba, "rgba8.png")
    save(patch.convert("P", palette=Image.Palette.ADAPTIVE, colors=200), "palette8.png")
    save(patch.convert("P", palette=Image.Palette.ADAPTIVE, colors=16), "palette4.png", bits=4)
    save(patch.convert("P", palette=Image.Palette.ADAPTIVE, colors=64), "palette-trns.png", transparency=5)
    save(grey, "grey8-trns.png", transparency=17)
    save(patch, "rgb8-trns.png", transparency=(10, 20, 30))
    save(patch, "rgb8-exif6.png", exif=exif_with_orientation(6))
    # PNG layouts Pillow does not save.
    g16 = np.asarray(grey, dtype=np.uint16) * 257 // 3  # spans values below and above 255
    g16[0, :8] = [0, 1, 255, 256, 257, 1000, 65534, 65535]
    write_png("grey16.png", 61, 47, 16, 0, g16)
    rgb16 = np.asarray(patch, dtype=np.uint16).reshape(47, -1) * 257 + np.arange(61 * 3, dtype=np.uint16) % 200
    write_png("rgb16.png", 61, 47, 16, 2, rgb16)
    la16 = np.stack([g16, 65535 - g16], axis=-1).reshape(47, -1)
    write_png("greyalpha16.png", 61, 47, 16, 4, la16)
    rgba16 = np.asarray(rgba, dtype=np.uint16).reshape(47, -1) * 251
    write_png("rgba16.png", 61, 47, 16, 6, rgba16)
    write_png("grey2.png", 61, 47, 2, 0, np.asarray(grey) >> 6)
    write_png("grey4.png", 61, 47, 4, 0, np.asarray(grey) >> 4)
    # Indices past a 3-entry palette: Pillow shows them as black.
    indices = (np.asarray(grey) >> 6).astype(np.uint8)
    write_png("palette2-short.png", 61, 47, 2, 3, indices, plte=[255, 0, 0, 0, 255, 0, 0, 0, 255], trns=[0, 128])

    # JPEG: subsamplings, progressive, greyscale, CMYK, every EXIF orientation.
    save(big_patch, "rgb420.jpg", quality=90)
    save(big_patch, "rgb444.jpg", quality=90, subsampling=0)
    save(big_patch, "rgb422.jpg", quality=85, subsampling=1)
    save(big_patch, "progressive.jpg", quality=80, progressive=True)
    save(big_patch.convert("L"), "grey.jpg", quality=90)
    save(big_patch.convert("CMYK"), "cmyk.jpg", quality=90)
    for orientation in range(2, 9):
        save(big_patch, f"exif{orientation}.jpg", quality=75, exif=exif_with_orientation(orientation))

    # WebP: lossy and lossless, with and without alpha.
    save(big_patch, "lossy.webp", quality=80)
    save(big_rgba, "lossy-alpha.webp", quality=80)
    save(big_patch, "lossless.webp", lossless=True)
    save(big_rgba, "lossless-alpha.webp", lossless=True)
    save(big_patch, "lossy-exif8.webp", quality=80, exif=exif_with_orientation(8))

    # XMP orientation (no EXIF): Pillow's getexif falls back to tiff:Orientation.
    xmp = b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF><rdf:Description tiff:Orientation="3"/></rdf:RDF></x:xmpmeta>'
    save(big_patch, "xmp3.jpg", quality=75, xmp=xmp)

    for name in ["chelsea.png", "rocket.jpg", "camera.png"]:
        shutil.copy(os.path.join(PHOTOS, name), os.path.join(OUT, name))

    decode = []
    for name in sorted(os.listdir(OUT)):
        if not name.endswith((".png", ".jpg", ".webp")):
            continue
        with Image.open(os.path.join(OUT, name)) as im:
            mode = im.mode
            rgb = ImageOps.exif_transpose(im).convert("RGB")
        decode.append({"file": name, "pillow_mode": mode, "width": rgb.width, "height": rgb.height,
                       "sha256": sha(rgb.tobytes())})
    return decode


def make_resize_cases():
    filters = {"nearest": Image.Resampling.NEAREST, "lanczos": Image.Resampling.LANCZOS,
               "bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
               "box": Image.Resampling.BOX, "hamming": Image.Resampling.HAMMING}
    sources = {name: load_image(os.path.join(OUT, name)) for name in ["chelsea.png", "rocket.jpg", "rgb8.png"]}
    # A single pixel, as its own file.
    Image.fromarray(np.array([[[200, 100, 30]]], dtype=np.uint8)).save(os.path.join(OUT, "pixel.png"))
    sources["pixel.png"] = load_image(os.path.join(OUT, "pixel.png"))
    cases = []

    def add(source, width, height, filter_name):
        out = sources[source].resize((width, height), resample=filters[filter_name])
        cases.append({"source": source, "width": width, "height": height, "filter": filter_name,
                      "sha256": sha(out.tobytes())})

    for filter_name in ["bicubic", "bilinear", "lanczos"]:
        add("chelsea.png", 224, 149, filter_name)  # down, CLIP-like
        add("chelsea.png", 1000, 665, filter_name)  # up
        add("rocket.jpg", 225, 224, filter_name)  # down, different factor per axis
        add("rocket.jpg", 1, 1, filter_name)
        add("rocket.jpg", 3, 1000, filter_name)
        add("rocket.jpg", 1000, 3, filter_name)
        add("rgb8.png", 224, 224, filter_name)  # source smaller than target
        add("rgb8.png", 61, 20, filter_name)  # one axis unchanged: vertical pass only
        add("rgb8.png", 30, 47, filter_name)  # horizontal pass only
        add("pixel.png", 224, 224, filter_name)
    # Pillow 13 goes vertical-first when height shrinks by more than twice the width's shrink (in pixels):
    # 47 - 26 = 21 > 2 * (61 - 51) = 20 is vertical-first, 47 - 27 = 20 is not.
    for filter_name in ["bicubic", "lanczos"]:
        add("rgb8.png", 51, 26, filter_name)
        add("rgb8.png", 51, 27, filter_name)
        add("rocket.jpg", 600, 50, filter_name)
    for filter_name in ["nearest", "box", "hamming"]:
        add("chelsea.png", 224, 149, filter_name)
        add("rgb8.png", 130, 99, filter_name)
    add("chelsea.png", 451, 300, "bicubic")  # same size: a copy
    return cases


def make_clip_cases():
    configs = {
        # The form of openai/clip-vit-base-patch32's preprocessor_config.json (ints for size and crop_size).
        "clip-default": {
            "crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
            "feature_extractor_type": "CLIPFeatureExtractor",
            "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
            "resample": 3, "size": 224,
        },
        # The newer dict form, with everything off the defaults.
        "clip-custom": {
            "image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 64},
            "crop_size": {"height": 56, "width": 50}, "resample": 2, "image_mean": [0.5, 0.4, 0.3],
            "image_std": [0.2, 0.3, 0.25], "rescale_factor": 0.00392156862745098, "do_convert_rgb": True,
        },
        # Resize to a fixed size smaller than the crop: the crop pads with zeros.
        "clip-pad": {"size": {"height": 41, "width": 37}, "crop_size": {"height": 56, "width": 56}, "resample": 1},
    }
    image_sets = {"clip-default": ["chelsea.png", "rocket.jpg"],
                  "clip-custom": ["chelsea.png", "rocket.jpg", "camera.png"],
                  "clip-pad": ["chelsea.png"]}
    cases = []
    for name, config in configs.items():
        config_dir = os.path.join(OUT, name)
        os.makedirs(config_dir, exist_ok=True)
        with open(os.path.join(config_dir, "preprocessor_config.json"), "w") as f:
            json.dump(config, f, indent=2)
        processor = CLIPImageProcessorPil.from_pretrained(config_dir)
        images = [load_image(os.path.join(OUT, image)) for image in image_sets[name]]
        pixel_values = processor(images, return_tensors="pt").pixel_values.numpy()
        assert pixel_values.dtype == np.float32
        out_name = f"{name}.f32"
        pixel_values.astype("<f4").tofile(os.path.join(OUT, out_name))
        cases.append({"config": name, "images": image_sets[name], "shape": list(pixel_values.shape),
                      "pixel_values": out_name})
    return cases


PROCESSOR_CASES = {
    # name: (files of the directory, photos)
    "blip": ({"preprocessor_config.json": {
        "image_processor_type": "BlipImageProcessor", "size": {"height": 40, "width": 48}, "do_convert_rgb": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "processor_class": "BlipProcessor"}}, ["chelsea.png", "rocket.jpg"]),
    # An int size: BLIP reads it as a square.
    "blip-fast-int-size": ({"preprocessor_config.json": {"image_processor_type": "BlipImageProcessorFast", "size": 36}},
                           ["rocket.jpg"]),
    # No class named: config.json's model_type decides.
    "blip2-by-model-type": ({"preprocessor_config.json": {"size": {"height": 32, "width": 30}, "resample": 2},
                             "config.json": {"model_type": "blip-2"}}, ["chelsea.png"]),
    "vit-pil-suffix": ({"preprocessor_config.json": {"image_processor_type": "ViTImageProcessorPil", "size": 30}},
                       ["camera.png", "rocket.jpg"]),
    # The nested form newer processors save, with no preprocessor_config.json.
    "siglip-nested": ({"processor_config.json": {"processor_class": "SiglipProcessor", "image_processor": {
        "image_processor_type": "SiglipImageProcessor", "size": {"height": 28, "width": 28}}}}, ["chelsea.png"]),
    "clip-feature-extractor": ({"preprocessor_config.json": {
        "feature_extractor_type": "CLIPFeatureExtractor", "size": 44, "crop_size": 40}}, ["rocket.jpg"]),
}


def make_processor_cases():
    root = os.path.join(OUT, "processors")
    shutil.rmtree(root, ignore_errors=True)
    cases = []
    for name, (files, photos) in PROCESSOR_CASES.items():
        directory = os.path.join(root, name)
        os.makedirs(directory)
        for file, content in files.items():
            with open(os.path.join(directory, file), "w") as f:
                json.dump(content, f, indent=2)
        processor = AutoImageProcessor.from_pretrained(directory, backend="pil")
        images = [load_image(os.path.join(OUT, photo)) for photo in photos]
        pixel_values = processor(images, return_tensors="pt").pixel_values.numpy()
        assert pixel_values.dtype == np.float32
        pixel_values.astype("<f4").tofile(os.path.join(directory, "pixel_values.f32"))
        cases.append({"directory": f"processors/{name}", "class": type(processor).__name__, "images": photos,
                      "shape": list(pixel_values.shape)})
    return cases


def main():
    if sys.argv[1:] == ["processors"]:
        with open(os.path.join(OUT, "manifest.json")) as f:
            manifest = json.load(f)
        manifest["processors"] = make_processor_cases()
        with open(os.path.join(OUT, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        return
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    manifest = {"decode": make_decode_fixtures(), "resize": make_resize_cases(), "clip": make_clip_cases(),
                "processors": make_processor_cases()}
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
