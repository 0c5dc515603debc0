"""Fixtures for OddImageTests: small odd and hostile files of each class Pillow and SwiftVLM once disagreed on, and GIF,
BMP and TIFF files, made with Pillow or by editing its bytes, and what transformers' `load_image` makes of each.

Run by hand: python oracle/odd_images.py
Writes Tests/Fixtures/odd-images/: the files, and manifest.json with, for each file, either the width, height and
SHA-256 of `ImageOps.exif_transpose(Image.open(f)).convert("RGB")`'s bytes, or "refused" with Pillow's exception.
"""
import hashlib
import io
import json
import os
import struct
import zlib

import numpy as np
from PIL import Image, ImageOps
from transformers.image_utils import load_image

HERE = os.path.dirname(os.path.abspath(__file__))
PHOTOS = os.path.join(HERE, "..", "Tests", "Fixtures", "photos")
OUT = os.path.join(HERE, "..", "Tests", "Fixtures", "odd-images")


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def chunks(png):
    """The (kind, data) chunks of a PNG."""
    out, at = [], 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        out.append((png[at + 4 : at + 8], png[at + 8 : at + 8 + length]))
        at += 12 + length
    return out


def assemble(parts):
    return b"\x89PNG\r\n\x1a\n" + b"".join(chunk(kind, data) for kind, data in parts)


def planar_tiff(image, photometric, deflate):
    """A little-endian TIFF holding each band of `image` as a plane of its own (PlanarConfiguration 2), one strip a
    plane, raw or zlib-compressed: Pillow reads such files but cannot write them."""
    width, height = image.size
    planes = [zlib.compress(band.tobytes()) if deflate else band.tobytes() for band in image.split()]
    count = len(planes)
    entries = [(256, 4, 1, width), (257, 4, 1, height), (258, 3, count, None), (259, 3, 1, 8 if deflate else 1),
               (262, 3, 1, photometric), (273, 4, count, None), (277, 3, 1, count), (278, 4, 1, height),
               (279, 4, count, None), (284, 3, 1, 2)]
    arrays_at = 8 + 2 + 12 * len(entries) + 4
    bits_at, offsets_at, counts_at = arrays_at, arrays_at + 2 * count, arrays_at + 6 * count
    data_at = arrays_at + 10 * count
    offsets = [data_at + sum(len(p) for p in planes[:i]) for i in range(count)]
    ifd = struct.pack("<H", len(entries))
    for tag, kind, n, value in entries:
        value = {258: bits_at, 273: offsets_at, 279: counts_at}.get(tag, value)
        ifd += struct.pack("<HHII", tag, kind, n, value) if kind == 4 or n > 1 else struct.pack("<HHIHH", tag, kind, n, value, 0)
    arrays = struct.pack(f"<{count}H", *[8] * count) + struct.pack(f"<{count}I", *offsets)
    arrays += struct.pack(f"<{count}I", *[len(p) for p in planes])
    return b"II*\0" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + arrays + b"".join(planes)


def exif(orientation):
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def encoded(im, fmt, **kw):
    buffer = io.BytesIO()
    im.save(buffer, fmt, **kw)
    return buffer.getvalue()


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in os.listdir(OUT):
        os.remove(os.path.join(OUT, name))
    photo = Image.open(os.path.join(PHOTOS, "chelsea.png")).convert("RGB")
    patch = photo.crop((200, 80, 237, 109))  # 37x29
    files = {}

    # PNG transparency: Pillow's convert("RGB") keeps the colour channels under tRNS and palette alpha.
    palette = patch.convert("P", palette=Image.Palette.ADAPTIVE, colors=32)
    files["palette-alpha.png"] = encoded(palette, "PNG", transparency=bytes(range(0, 256, 8)))
    files["palette-trns.png"] = encoded(palette, "PNG", transparency=3)
    files["rgb-trns.png"] = encoded(patch, "PNG", transparency=tuple(patch.getpixel((0, 0))))
    la = patch.convert("L")
    files["grey-trns.png"] = encoded(la, "PNG", transparency=int(la.getpixel((1, 1))))

    # EXIF orientation in a PNG: an eXIf chunk before the image data, one after it, ImageMagick's text profile.
    files["exif6-before-idat.png"] = encoded(patch, "PNG", exif=exif(6))
    plain = chunks(encoded(patch, "PNG"))
    files["exif8-after-idat.png"] = assemble(plain[:-1] + [(b"eXIf", exif(8))] + plain[-1:])
    raw = exif(3)
    profile = f"\nexif\n{len(raw):8}\n{raw.hex()}\n".encode()
    files["exif3-imagemagick.png"] = assemble(plain[:1] + [(b"zTXt", b"Raw profile type exif\0\0" + zlib.compress(profile))] + plain[1:])
    files["exif-garbage.png"] = assemble(plain[:1] + [(b"eXIf", b"not a TIFF header")] + plain[1:])
    # XMP in iTXt chunks whose text holds a NUL: Pillow decodes the whole text, so bytes after the NUL that are not
    # UTF-8 make it drop the chunk's text.
    xmp = b'<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    itxt = b"XML:com.adobe.xmp\0\0\0\0\0"
    files["xmp-nul-orientation6.png"] = assemble(plain[:1] + [(b"iTXt", itxt + b"\0" + xmp)] + plain[1:])
    files["xmp-nul-not-utf8.png"] = assemble(plain[:1] + [(b"iTXt", itxt + xmp + b"\0\xff")] + plain[1:])
    # Compressed iTXt texts of a NUL and a million letters each: their characters, NUL and all, count toward
    # MAX_TEXT_MEMORY.
    nul_text = (b"iTXt", b"Comment\0\x01\0\0\0" + zlib.compress(b"\0" + b"a" * 1_000_000))
    files["itxt-nul-text-memory.png"] = assemble(plain[:1] + [nul_text] * 70 + plain[1:])

    # PNGs Pillow refuses: a truncated final chunk, an unknown compression method, an APNG out of sequence, text
    # that inflates past MAX_TEXT_CHUNK.
    after = assemble(plain[:-1] + [(b"tEXt", b"Comment\0" + b"x" * 40)])
    files["truncated-text-after-idat.png"] = after[:-20]
    files["truncated-iend-header.png"] = assemble(plain)[:-6]  # a chunk header cut short ends Pillow's walk quietly
    files["ztxt-method1.png"] = assemble(plain[:1] + [(b"zTXt", b"Comment\0\x01" + zlib.compress(b"hello"))] + plain[1:])
    files["ztxt-too-large.png"] = assemble(plain[:1] + [(b"zTXt", b"Comment\0\0" + zlib.compress(b"a" * (1 << 20 + 1)))] + plain[1:])
    files["itxt-too-large.png"] = assemble(plain[:1] + [(b"iTXt", b"Comment\0\x01\0\0\0" + zlib.compress(b"a" * (1 << 20 + 1)))] + plain[1:])
    frames = [patch, patch.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    apng = chunks(encoded(frames[0], "PNG", save_all=True, append_images=frames[1:]))
    broken = []
    for kind, data in apng:
        if kind in (b"fcTL", b"fdAT") and struct.unpack(">I", data[:4])[0] >= 1:
            data = struct.pack(">I", struct.unpack(">I", data[:4])[0] + 1) + data[4:]  # a gap after frame 0
        broken.append((kind, data))
    files["apng.png"] = assemble(apng)
    files["apng-sequence-gap.png"] = assemble(broken)  # after frame 0: Pillow never reads that far
    restarted = [(k, struct.pack(">I", 5) + d[4:] if k == b"fcTL" and d[:4] == b"\0\0\0\0" else d) for k, d in apng]
    files["apng-first-sequence-5.png"] = assemble(restarted)
    first_fctl = [i for i, (kind, _) in enumerate(apng) if kind == b"fcTL"][0]
    files["apng-no-first-fctl.png"] = assemble([(k, d) for i, (k, d) in enumerate(apng) if i != first_fctl])

    # PNG image data as Pillow reads it: IDAT checksums unchecked, unknown critical chunks skipped, a duplicate PLTE
    # (the last wins), zlib's own checksum checked.
    idat = [i for i, (kind, _) in enumerate(plain) if kind == b"IDAT"][0]
    bad_crc = assemble(plain)
    at = bad_crc.index(b"IDAT") + 4 + len(plain[idat][1])
    files["idat-bad-crc.png"] = bad_crc[:at] + bytes(b ^ 0xFF for b in bad_crc[at : at + 4]) + bad_crc[at + 4 :]
    files["unknown-critical-chunk.png"] = assemble(plain[:idat] + [(b"ZZZZ", b"critical?")] + plain[idat:])
    broken_adler = plain[idat][1][:-1] + bytes([plain[idat][1][-1] ^ 1])
    files["idat-bad-adler32.png"] = assemble(plain[:idat] + [(b"IDAT", broken_adler)] + plain[idat + 1 :])
    pal = chunks(encoded(palette, "PNG"))
    plte = [i for i, (kind, _) in enumerate(pal) if kind == b"PLTE"][0]
    files["two-palettes.png"] = assemble(pal[: plte + 1] + [(b"PLTE", pal[plte][1][::-1])] + pal[plte + 1 :])

    # WebP: the first frame of an animation (frames of their own sizes on a larger canvas).
    big = photo.crop((150, 50, 214, 98))  # 64x48
    files["animated.webp"] = encoded(big, "WEBP", save_all=True, quality=80,
                                     append_images=[big.transpose(Image.Transpose.ROTATE_180)], duration=100)
    files["animated-lossless-alpha.webp"] = encoded(big.convert("RGBA"), "WEBP", save_all=True, lossless=True,
                                                    append_images=[big.convert("LA").convert("RGBA")], duration=100)

    # JPEG: stray bytes and FF00 before a marker, a truncated APP segment, unreadable EXIF with and without a JFIF
    # resolution (Pillow only reads the EXIF early, swallowing its failure, when JFIF gives none).
    jpeg = encoded(big, "JPEG", quality=85)
    dqt = jpeg.index(b"\xff\xdb")
    files["junk-before-marker.jpg"] = jpeg[:dqt] + b"\x00junk" + jpeg[dqt:]
    files["ff00-before-marker.jpg"] = jpeg[:dqt] + b"\xff\x00\xff\x00" + jpeg[dqt:]
    files["app14-overruns.jpg"] = jpeg[:dqt] + b"\xff\xee\x00\x0eAdobe" + jpeg[dqt:]
    files["app14-short-adobe.jpg"] = jpeg[:dqt] + b"\xff\xee\x00\x07Adobe" + jpeg[dqt:]
    files["app1-past-end.jpg"] = jpeg[:dqt] + b"\xff\xe1\x7f\xffExif\0\0"
    files["unknown-marker.jpg"] = jpeg[:dqt] + b"\xff\x05\x00\x04ab" + jpeg[dqt:]
    app1 = b"\xff\xe1" + struct.pack(">H", 2 + 16) + b"Exif\0\0garbage!!!!"
    files["bad-exif.jpg"] = jpeg[:2] + app1 + jpeg[2:]
    files["bad-exif-jfif-dpi.jpg"] = encoded(big, "JPEG", quality=85, dpi=(300, 300))
    at = files["bad-exif-jfif-dpi.jpg"].index(b"\xff\xdb")
    files["bad-exif-jfif-dpi.jpg"] = files["bad-exif-jfif-dpi.jpg"][:at] + app1 + files["bad-exif-jfif-dpi.jpg"][at:]
    files["junk-then-truncated.jpg"] = files["junk-before-marker.jpg"][:-40]  # libjpeg's first warning hides the end
    # Without the end-of-image marker: Pillow's decoder stops at the last scanline, so a baseline file whose scans are
    # complete decodes when enough bytes follow them for libjpeg's look-ahead (zeros), and not when the data stops
    # there or 0xFF fill follows; a progressive file needs the marker; zeros after a cut scan decode as data.
    progressive = encoded(big, "JPEG", quality=85, progressive=True)
    files["no-eoi.jpg"] = jpeg[:-2]
    files["no-eoi-zero-padded.jpg"] = jpeg[:-2] + b"\0" * 16
    files["no-eoi-ff-padded.jpg"] = jpeg[:-2] + b"\xff" * 16
    files["progressive-no-eoi-zero-padded.jpg"] = progressive[:-2] + b"\0" * 16
    files["cut-scan-zero-padded.jpg"] = jpeg[:-200] + b"\0" * 64
    files["exif-prefix-twice.jpg"] = encoded(big, "JPEG", quality=85, exif=b"Exif\0\0" + exif(6))

    # GIF, first frame: an animation, a frame smaller than the screen with a transparent index, interlacing, a local
    # palette, a file cut short.
    small = big.quantize(colors=64)
    files["animated.gif"] = encoded(small, "GIF", save_all=True, duration=100,
                                    append_images=[big.transpose(Image.Transpose.ROTATE_180).quantize(colors=64)])
    framed = encoded(small.crop((10, 8, 40, 30)), "GIF", transparency=2)
    screen = bytearray(framed)
    screen[6:10] = struct.pack("<HH", 64, 48)  # a larger logical screen...
    at = screen.index(b"\x2c", 13 + 3 * 64)
    screen[at + 1 : at + 5] = struct.pack("<HH", 20, 12)  # ...with the frame at (20, 12)
    files["frame-in-screen.gif"] = bytes(screen)
    files["interlaced.gif"] = encoded(small, "GIF", interlace=True)
    files["truncated.gif"] = files["interlaced.gif"][: len(files["interlaced.gif"]) // 2]

    # BMP and DIB, as Pillow writes them (1-bit, 8-bit palette, 24- and 32-bit), an RLE8 file by hand, a file cut short.
    files["rgb24.bmp"] = encoded(big, "BMP")
    files["rgba32.bmp"] = encoded(big.convert("RGBA"), "BMP")
    files["palette8.bmp"] = encoded(small, "BMP")
    files["mono.bmp"] = encoded(big.convert("1"), "BMP")
    files["rgb24.dib"] = encoded(big, "DIB")
    files["truncated.bmp"] = files["rgb24.bmp"][:-100]
    rle = b"".join(bytes([3, i, 0, 2, 2, 1, 0, 4, 5, 6, 7, 8, 0, 0]) for i in range(4)) + b"\0\1"  # runs, delta, literal
    header = struct.pack("<IiiHHIIiiII", 40, 12, 4, 1, 8, 1, len(rle), 0, 0, 16, 0)
    colours = b"".join(bytes([i * 16, 255 - i * 16, i * 8, 0]) for i in range(16))
    files["rle8.bmp"] = (b"BM" + struct.pack("<IHHI", 14 + 40 + 64 + len(rle), 0, 0, 14 + 40 + 64) + header + colours + rle)

    # TIFF, first page, the kinds read: RGB (LZW, Deflate, uncompressed), grey, bilevel (CCITT G4), palette, RGBA,
    # an Orientation tag, two pages.
    files["rgb-lzw.tif"] = encoded(big, "TIFF", compression="tiff_lzw")
    files["rgb-raw.tif"] = encoded(big, "TIFF")
    files["rgba-deflate.tif"] = encoded(big.convert("RGBA"), "TIFF", compression="tiff_adobe_deflate")
    files["grey-packbits.tif"] = encoded(big.convert("L"), "TIFF", compression="packbits")
    files["mono-g4.tif"] = encoded(big.convert("1"), "TIFF", compression="group4")
    files["palette.tif"] = encoded(small, "TIFF")
    files["orientation6.tif"] = encoded(big, "TIFF", exif=exif(6))
    files["two-pages.tif"] = encoded(big, "TIFF", save_all=True, append_images=[small])
    grey16 = (np.asarray(big.convert("L"), dtype=np.uint16) * 3).astype(np.uint16)  # spans values past 255
    files["grey16.tif"] = encoded(Image.fromarray(grey16), "TIFF")
    files["grey16-lzw.tif"] = encoded(Image.fromarray(grey16), "TIFF", compression="tiff_lzw")
    files["truncated.tif"] = files["rgb-raw.tif"][: len(files["rgb-raw.tif"]) // 2]
    # CIELab, converted to RGB through LittleCMS as Pillow converts it: interleaved, and planar raw and deflated
    # (whose planes Pillow copies without the offset its interleaved reader gives a* and b*).
    lab = big.convert("LAB")
    files["lab-lzw.tif"] = encoded(lab, "TIFF", compression="tiff_lzw")
    files["lab-planar.tif"] = planar_tiff(lab, photometric=8, deflate=False)
    files["lab-planar-deflate.tif"] = planar_tiff(lab, photometric=8, deflate=True)

    manifest = []
    for name in sorted(files):
        path = os.path.join(OUT, name)
        with open(path, "wb") as f:
            f.write(files[name])
        entry = {"file": name}
        try:
            rgb = load_image(path)  # transformers' own: open, exif_transpose, convert("RGB")
            entry.update(width=rgb.width, height=rgb.height, sha256=hashlib.sha256(rgb.tobytes()).hexdigest())
        except Exception as error:
            entry["refused"] = f"{type(error).__name__}: {error}".replace(path, name)[:200]
        manifest.append(entry)
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    for entry in manifest:
        print(entry["file"], entry.get("refused", f"{entry.get('width')}x{entry.get('height')}"))


if __name__ == "__main__":
    main()
