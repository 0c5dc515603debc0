"""The photo and question the image-chat benchmarks (bench_image_chat.py, bench_llava_gguf.py) ask about."""
import os

import numpy as np

PROMPT = "What is in this picture?"
WIDTH, HEIGHT = 640, 480


def noise_photo(path):
    """Writes a WIDTH×HEIGHT PNG of seeded noise to `path` and returns the path."""
    from PIL import Image
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pixels = np.random.default_rng(0x5EED).integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path
