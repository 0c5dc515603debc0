"""What bf16 costs a captioning model's first step, on the repo's photos: the logits of the first new token from
transformers/PyTorch in fp32 (`generate(output_logits=True)`) against `vlm caption --logits` in fp32 and bf16.

    python scripts/make_caption_checkpoints.py --only blip2-opt-2.7b-random     # once
    swift build -c release --product vlm
    python scripts/caption_logits_check.py [--model DIR] [--vlm .build/release/vlm]

Per photo: the cosine of each SwiftVLM precision's logits to PyTorch fp32's, their largest absolute difference, and
whether the first token (the argmax) agrees. PyTorch runs in a process of its own first, so that a 15 GB model is
never loaded twice at once.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torch_logits(model, photos, out):
    import torch
    from PIL import Image
    from transformers import AutoConfig, AutoProcessor, Blip2ForConditionalGeneration, BlipForConditionalGeneration

    model_class = {"blip-2": Blip2ForConditionalGeneration, "blip": BlipForConditionalGeneration}[
        AutoConfig.from_pretrained(model).model_type]
    network = model_class.from_pretrained(model, dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(model)
    rows = []
    for photo in photos:
        inputs = processor(images=Image.open(photo).convert("RGB"), return_tensors="pt")
        with torch.inference_mode():
            generated = network.generate(**inputs, max_new_tokens=1, do_sample=False, num_beams=1, output_logits=True,
                                         return_dict_in_generate=True)
        rows.append(generated.logits[0][0].float().numpy())
    np.save(out, np.stack(rows))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=os.path.join(ROOT, "models", "blip2-opt-2.7b-random"))
    parser.add_argument("--vlm", default=os.path.join(ROOT, ".build", "release", "vlm"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    photos = sorted(glob.glob(os.path.join(ROOT, "Tests", "Fixtures", "photos", "*")))
    if args.worker:
        import torch
        torch.set_num_threads(args.threads)
        return torch_logits(args.model, photos, args.worker)

    environment = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory() as scratch:
        reference = os.path.join(scratch, "torch.npy")
        subprocess.run([sys.executable, os.path.abspath(__file__), "--model", args.model, "--threads", str(args.threads),
                        "--worker", reference], check=True, env=environment)
        expected = np.load(reference)
        results = {}
        for dtype in ("fp32", "bf16"):
            path = os.path.join(scratch, f"{dtype}.npy")
            subprocess.run([args.vlm, "caption", *photos, "--model", args.model, "--dtype", dtype, "--max-new-tokens", "1",
                            "--logits", path], check=True, env=environment, stdout=subprocess.DEVNULL)
            results[dtype] = np.load(path)
    print(f"{os.path.basename(args.model)}: first-step logits against transformers fp32\n")
    print("| photo | SwiftVLM | cosine | largest |difference| | same first token |")
    print("|---|---|---:|---:|---|")
    report = []
    for index, photo in enumerate(photos):
        for dtype, logits in results.items():
            a, b = expected[index].astype(np.float64), logits[index].astype(np.float64)
            cosine = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
            largest = float(np.abs(a - b).max())
            same = bool(a.argmax() == b.argmax())
            report.append(dict(photo=os.path.basename(photo), dtype=dtype, cosine=cosine, largest_difference=largest,
                               same_first_token=same))
            print(f"| {os.path.basename(photo)} | {dtype} | {cosine:.6f} | {largest:.2e} | {'yes' if same else 'no'} |")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
