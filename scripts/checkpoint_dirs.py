"""Writing a benchmark checkpoint directory once (scripts/make_image_chat_checkpoints.py, make_caption_checkpoints.py)."""
import os
import shutil
import tempfile


def is_written(out):
    """Whether `out` holds a complete checkpoint: its weights are the last thing a write puts there."""
    return any(os.path.exists(os.path.join(out, name)) for name in ("model.safetensors.index.json", "model.safetensors"))


def write_once(out, write):
    """Calls `write(directory)` to build the checkpoint `out` unless it is already written. The directory is made
    beside `out` and renamed into place, so an interrupted run leaves no half checkpoint."""
    if is_written(out):
        print(f"{out}: already written")
        return
    os.makedirs(os.path.dirname(out), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=os.path.basename(out) + ".", dir=os.path.dirname(out))
    try:
        write(staging)
        os.rename(staging, out)
        os.chmod(out, 0o755)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
