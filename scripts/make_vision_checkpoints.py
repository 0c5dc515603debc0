"""Writes full-size, randomly initialised zero-shot vision checkpoints for benchmarking (scripts/bench_vision.py).

    python scripts/make_vision_checkpoints.py [--models NAME ...] [--seed N]

One directory per model under models/ (git-ignored; nothing here is committed), named <published name>-random:

| directory | published checkpoint | class |
|---|---|---|
| clipseg-rd64-refined-random | CIDAS/clipseg-rd64-refined | CLIPSegForImageSegmentation |
| owlv2-base-patch16-ensemble-random | google/owlv2-base-patch16-ensemble (960×960) | Owlv2ForObjectDetection |
| vilt-b32-finetuned-vqa-random | dandelin/vilt-b32-finetuned-vqa | ViltForQuestionAnswering |
| siglip-base-patch16-224-random | google/siglip-base-patch16-224 | SiglipModel |

The weights are random (seeded, so every run writes the same tensors) and fp32, as the published ones are stored; the
architecture and the processor configuration are the published ones. Each config starts from transformers' config
class defaults and sets the published values (comments below say which come from where); the tokenizers are the real
ones kept in Tests/Fixtures (the CLIP BPE tokenizer for CLIPSeg and OWLv2, BERT uncased for ViLT) or, for SigLIP,
whose 32000-piece spiece.model is not in the fixtures, the fixtures' small SentencePiece model in the published
layout (spiece.model, no tokenizer.json): its ids all lie inside the published 32000-token vocabulary, and a prompt's
length, which is what a benchmark's time depends on, is padded to the text tower's 64 positions anyway.

A directory that already holds a complete checkpoint is left alone, so the script is safe to run before every benchmark.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
MODELS = os.path.join(ROOT, "models")
CLIP_TOKENIZER = os.path.join(FIXTURES, "tokenizers", "clip")
BERT_TOKENIZER = os.path.join(FIXTURES, "tokenizers", "real", "bert-uncased")
SIGLIP_TOKENIZER = os.path.join(FIXTURES, "siglip", "tiny-tanh-fp16")

# OpenAI CLIP's normalisation (OWLv2's processor) and ImageNet's (CLIPSeg's ViTImageProcessor), as published.
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

# The CLIP ViT-B/16 text tower every published CLIPSeg and OWL-ViT/OWLv2 checkpoint uses (OpenAI's: width 512,
# 12 layers of 8 heads, the 49408-token BPE vocabulary); the positions differ (77 for CLIPSeg, 16 for OWL).
CLIP_TEXT = dict(vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                 num_attention_heads=8, hidden_act="quick_gelu", layer_norm_eps=1e-5)
# ...and its ViT-B/16 image tower (width 768, 12 layers of 12 heads, 16-pixel patches).
CLIP_VISION_B16 = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                       patch_size=16, num_channels=3, hidden_act="quick_gelu", layer_norm_eps=1e-5)
# Each upsampling layer's weights times this: (0.2)³ takes random init's logits from thousands to tens.
UPSAMPLING_GAIN = 0.2


def copy_tokenizer(source, out, names, overrides):
    """Copies a fixture tokenizer's files, with `overrides` set in its tokenizer_config.json."""
    for name in names:
        shutil.copyfile(os.path.join(source, name), os.path.join(out, name))
    path = os.path.join(out, "tokenizer_config.json")
    with open(os.path.join(source, "tokenizer_config.json")) as f:
        config = json.load(f)
    config.update(overrides)
    with open(path, "w") as f:
        json.dump(config, f, indent=1, sort_keys=True)


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def clipseg(out):
    import torch
    from transformers import CLIPSegConfig, CLIPSegForImageSegmentation
    # CIDAS/clipseg-rd64-refined: "rd64" is reduce_dim 64; "refined" the complex transposed convolution; the decoder
    # reads the vision layers [3, 6, 9] with 4 heads and a 2048-wide MLP (CLIPSegConfig's defaults are these too).
    config = CLIPSegConfig(text_config=dict(CLIP_TEXT, max_position_embeddings=77),
                           vision_config=dict(CLIP_VISION_B16, image_size=224), projection_dim=512,
                           reduce_dim=64, extract_layers=[3, 6, 9], decoder_num_attention_heads=4,
                           decoder_intermediate_size=2048, conditional_layer=0,
                           use_complex_transposed_convolution=True)
    model = CLIPSegForImageSegmentation(config).eval()
    # Random init lets the refined decoder's three upsampling layers reach logits in the thousands, where fp32's
    # rounding alone moves a probability near 0.5 by more than 1e-4; scaled down as oracle/clipseg.py scales them, the
    # logits span tens of units as a trained model's do, and bench_vision.py's ONNX check means something. The values
    # do not change the time.
    with torch.no_grad():
        for layer in model.decoder.transposed_convolution.modules():
            if isinstance(layer, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)):
                layer.weight.mul_(UPSAMPLING_GAIN)
                layer.bias.mul_(UPSAMPLING_GAIN)
    model.save_pretrained(out)
    # The published ViTImageProcessor: 352×352 bilinear, ImageNet normalisation.
    write_json(os.path.join(out, "preprocessor_config.json"), {
        "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": IMAGENET_MEAN,
        "image_processor_type": "ViTImageProcessor", "image_std": IMAGENET_STD, "resample": 2,
        "rescale_factor": 1 / 255, "size": {"height": 352, "width": 352}})
    # CIDAS's tokenizer pads with "!" (as oracle/clipseg.py's refined fixture does) to the 77 positions.
    copy_tokenizer(CLIP_TOKENIZER, out, ["tokenizer.json"], {"model_max_length": 77, "pad_token": "!"})


def owlv2(out):
    import torch
    from transformers import Owlv2Config, Owlv2ForObjectDetection
    # google/owlv2-base-patch16-ensemble: CLIP B/16 towers, the image one at 960×960 (3600 patches), 16 text positions.
    config = Owlv2Config(text_config=dict(CLIP_TEXT, max_position_embeddings=16),
                         vision_config=dict(CLIP_VISION_B16, image_size=960), projection_dim=512)
    model = Owlv2ForObjectDetection(config).eval()
    # Init's unit-variance heads saturate every sigmoid (objectness logits in the tens of thousands, boxes whose fp32
    # rounding alone moves them by 2e-3); drawn as oracle/owlvit.py draws them, scaled to the width, the heads give
    # a trained model's ranges and bench_vision.py's ONNX check means something. The values do not change the time.
    width = config.vision_config.hidden_size
    with torch.no_grad():
        for layer, gain in [(model.box_head.dense0, 1.0), (model.box_head.dense1, 1.0), (model.box_head.dense2, 0.5),
                            (model.class_head.logit_shift, 0.3), (model.class_head.logit_scale, 0.3),
                            (model.objectness_head.dense0, 1.0), (model.objectness_head.dense1, 1.0),
                            (model.objectness_head.dense2, 1.0)]:
            layer.weight.normal_(0, gain / width ** 0.5)
    model.save_pretrained(out)
    # The published Owlv2ImageProcessor: pad to a grey square, resize to 960×960 bilinearly, CLIP normalisation.
    write_json(os.path.join(out, "preprocessor_config.json"), {
        "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True, "image_mean": CLIP_MEAN,
        "image_processor_type": "Owlv2ImageProcessor", "image_std": CLIP_STD, "resample": 2,
        "rescale_factor": 1 / 255, "size": {"height": 960, "width": 960}})
    copy_tokenizer(CLIP_TOKENIZER, out, ["tokenizer.json"], {"model_max_length": 16})


def vilt(out):
    from transformers import ViltConfig, ViltForQuestionAnswering
    # dandelin/vilt-b32-finetuned-vqa: ViltConfig's defaults are ViLT-B/32 (768 wide, 12 layers, 384-pixel images in
    # 32-pixel patches, 40 text positions, BERT's 30522-token vocabulary); the VQA head answers 3129 VQAv2 answers,
    # named here by number since the published names are not at hand.
    labels = {index: f"answer {index}" for index in range(3129)}
    config = ViltConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, image_size=384, patch_size=32, max_position_embeddings=40,
                        qkv_bias=True, id2label=labels, label2id={v: k for k, v in labels.items()})
    ViltForQuestionAnswering(config).eval().save_pretrained(out)
    # The published ViltImageProcessor: shortest edge 384 (longest 640), sides a multiple of 32, bicubic, 0.5/0.5.
    write_json(os.path.join(out, "preprocessor_config.json"), {
        "do_normalize": True, "do_pad": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "ViltImageProcessor", "image_std": [0.5, 0.5, 0.5], "resample": 3,
        "rescale_factor": 1 / 255, "size": {"shortest_edge": 384}, "size_divisor": 32})
    copy_tokenizer(BERT_TOKENIZER, out, ["tokenizer.json", "special_tokens_map.json"], {"model_max_length": 40})


def siglip(out):
    from transformers import SiglipConfig, SiglipModel, SiglipTokenizer
    copy_tokenizer(SIGLIP_TOKENIZER, out, ["spiece.model"], {"model_max_length": 64})
    tokenizer = SiglipTokenizer.from_pretrained(out)
    # google/siglip-base-patch16-224: B/16 towers 768 wide, 12 layers of 12 heads, tanh-approximated GELU, 1e-6 layer
    # norms; a 32000-token text vocabulary and 64 positions.
    tower = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                 hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
    config = SiglipConfig(text_config=dict(tower, vocab_size=32000, max_position_embeddings=64,
                                           pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                           bos_token_id=None),
                          vision_config=dict(tower, image_size=224, patch_size=16, num_channels=3))
    SiglipModel(config).eval().save_pretrained(out)
    # The published SiglipImageProcessor: 224×224 bicubic, 0.5/0.5.
    write_json(os.path.join(out, "preprocessor_config.json"), {
        "do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "SiglipImageProcessor", "image_std": [0.5, 0.5, 0.5], "resample": 3,
        "rescale_factor": 1 / 255, "size": {"height": 224, "width": 224}})


CHECKPOINTS = {
    "clipseg-rd64-refined": clipseg,
    "owlv2-base-patch16-ensemble": owlv2,
    "vilt-b32-finetuned-vqa": vilt,
    "siglip-base-patch16-224": siglip,
}


def checkpoint_dir(name):
    return os.path.join(MODELS, f"{name}-random")


def check(out):
    """transformers loads what was written: the model, its image processor and its tokenizer."""
    from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer
    AutoConfig.from_pretrained(out)
    AutoImageProcessor.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(CHECKPOINTS), default=list(CHECKPOINTS))
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the random weights (default: 0)")
    args = parser.parse_args()

    import torch
    for name in args.models:
        out_dir = checkpoint_dir(name)
        if os.path.exists(out_dir):
            if not os.path.isfile(os.path.join(out_dir, "model.safetensors")):
                sys.exit(f"{out_dir} exists but holds no model.safetensors: remove it")
            print(f"{out_dir} already holds a checkpoint; left as it is")
            continue
        os.makedirs(MODELS, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=MODELS) as work_dir:
            # Built beside the target and renamed into place, so an interrupted run never leaves a half checkpoint.
            staging = os.path.join(work_dir, "checkpoint")
            os.makedirs(staging)
            torch.manual_seed(args.seed)
            CHECKPOINTS[name](staging)
            check(staging)
            os.rename(staging, out_dir)
        print(f"wrote {out_dir}")


if __name__ == "__main__":
    main()
