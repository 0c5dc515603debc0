"""SigLIP fixtures: tiny random-init checkpoints with a real SentencePiece tokenizer, and what transformers computes
with them on real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt, plus sentencepiece and protobuf,
which SiglipTokenizer needs):

    pip download --no-deps --no-binary :all: sentencepiece==0.2.3 -d /tmp/sp
    tar xzf /tmp/sp/sentencepiece-0.2.3.tar.gz -C /tmp/sp sentencepiece-0.2.3/test/botchan_en_unigram_1000.model
    python oracle/siglip.py --spm /tmp/sp/sentencepiece-0.2.3/test/botchan_en_unigram_1000.model

The SentencePiece model is the English Unigram model (1000 pieces, nmt_nfkc normalizer) that sentencepiece's own
tests use; SiglipTokenizer loads it as it loads a SigLIP checkpoint's spiece.model.

SiglipTokenizer is slow-only in transformers 5.23: AutoTokenizer builds the Python SentencePiece tokenizer, and
convert_slow_tokenizer has no converter for it. The converter below states it as tokenizer.json (SpmConverter's
Unigram, plus SiglipTokenizer's canonicalize_text as normalizers); SwiftVLM builds the same pipeline from spiece.model
itself (VLMTokenizers' LegacyTokenizers.swift) and reads such a tokenizer.json too. This script records where the
pipeline and the slow tokenizer disagree: only texts that hold a special token's literal text ("</s>", "<unk>"), which
the slow tokenizer encodes chunk by chunk with rules tokenizer.json cannot state, and a few combining-mark sequences,
which tokenizers' Precompiled normalizer maps grapheme by grapheme where sentencepiece takes the longest match.

Writes Tests/Fixtures/siglip/<checkpoint>/ (a checkpoint directory SwiftVLM loads as is, plus expected.safetensors and
expected.json: "tiny-tanh-fp16" laid out like the published SigLIP checkpoints, spiece.model and no tokenizer.json;
"tiny-gelu-bf16" with the converted tokenizer.json beside it, model_input_names ["input_ids"] as the published
tokenizer_config.json files have it (so that no attention mask reaches the text tower) and a model_max_length of 48,
which the processor pads to while the pipeline pads to 64) and Tests/Fixtures/siglip/tokenizer-strings.json (the
slow tokenizer's ids for the shared tokenizer strings).
"""
import argparse
import json
import os
import shutil
import string
import tempfile
import warnings

import torch
from PIL import Image
from safetensors.torch import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import Unigram
from transformers import (AutoTokenizer, SiglipConfig, SiglipImageProcessorPil, SiglipModel, SiglipTokenizer,
                          pipeline)
from transformers.convert_slow_tokenizer import SpmConverter
from transformers.image_utils import load_image
from transformers.utils import logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
PHOTOS = ["chelsea.png", "coffee.png", "rocket.jpg", "camera.png"]

# Embedded with padding="max_length" (model_max_length tokens) and no truncation, as SigLIP's processor is documented
# to be called: every text fits, the last one exactly where model_max_length is 64 (it is left out where it is not).
TEXTS = [
    "a photo of a cat",
    "A photo of a DOG!",
    "This is a photo of coffee.",
    "",
    "Ünïcödé text, with CJK 猫 and emoji 🚀",
    "  leading spaces, (punctuation) & a tab\there",
    "a photo of " * 10 + "a cat",  # 64 tokens with its eos
]
LABELS = ["cat", "coffee", "rocket", "camera man"]
TEMPLATE = "This is a photo of {}."
# A label whose prompt passes the 64 tokens the pipeline pads to: transformers truncates it, SwiftVLM refuses it.
TOO_LONG_LABEL = " ".join(["a very long label"] * 12)

# Python's str.isspace() set, which canonicalize_text's re.sub(r"\s+", " ", ...) collapses.
PYTHON_WHITESPACE = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())
assert "".join(sorted(string.punctuation)) == "".join(chr(c) for c in [*range(0x21, 0x30), *range(0x3A, 0x41),
                                                                       *range(0x5B, 0x61), *range(0x7B, 0x7F)])


class SiglipConverter(SpmConverter):
    """What a SiglipTokenizer converter would be: SiglipTokenizer.tokenize prepends "▁" (after turning "▁" into
    spaces), canonicalize_text lowercases, drops string.punctuation, collapses whitespace and strips (the prepended
    "▁" keeps a leading space), then sentencepiece normalizes (nmt_nfkc, extra spaces, trailing "▁" removed) and
    splits at "▁"; build_inputs_with_special_tokens appends "</s>"."""

    def tokenizer(self, proto):
        tokenizer = Tokenizer(Unigram(self.vocab(proto), unk_id=self.unk_id(proto),
                                      byte_fallback=proto.trainer_spec.byte_fallback))
        # Only the tokenizer's own special tokens split the text; the model's other control pieces (<s>) do not.
        tokenizer.add_special_tokens([AddedToken(t.content, normalized=False, special=True)
                                      for _, t in sorted(self.original_tokenizer.added_tokens_decoder.items())])
        return tokenizer

    def normalizer(self, proto):
        steps = [normalizers.Replace("▁", " "), normalizers.Prepend("▁")]
        if self.original_tokenizer.do_lower_case:
            steps.append(normalizers.Lowercase())
        steps += [
            normalizers.Replace(Regex("[!-/:-@\\[-`{-~]"), ""),
            normalizers.Replace(Regex("[" + PYTHON_WHITESPACE + "]+"), " "),
            normalizers.Strip(left=False, right=True),
        ]
        if proto.normalizer_spec.precompiled_charsmap:
            steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
        if proto.normalizer_spec.remove_extra_whitespaces:
            steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip(left=False, right=True)]
        steps.append(normalizers.Replace(Regex("^▁$"), ""))
        return normalizers.Sequence(steps)

    def pre_tokenizer(self, replacement, add_prefix_space):
        return pre_tokenizers.Metaspace(replacement=replacement, prepend_scheme="never")

    def decoder(self, replacement, add_prefix_space):
        return decoders.Metaspace(replacement=replacement, prepend_scheme="always")

    def post_processor(self):
        eos = self.original_tokenizer.eos_token
        return processors.TemplateProcessing(single=["$A", eos], pair=["$A", eos, "$B", eos],
                                             special_tokens=[(eos, self.original_tokenizer.eos_token_id)])


def write_tokenizer(slow, out, converted):
    """What save_pretrained writes for the slow tokenizer (spiece.model, tokenizer_config.json), and with
    `converted` the tokenizer.json of the converter."""
    slow.save_pretrained(out)
    if converted:
        SiglipConverter(slow).converted().save(os.path.join(out, "tokenizer.json"))


def tokenizer_strings(slow, tokenizer_json):
    """The slow ids of the shared tokenizer strings, and where the converted tokenizer.json gives other ids."""
    with open(os.path.join(FIXTURES, "tokenizers", "real", "strings.json"), encoding="utf-8") as f:
        strings = json.load(f)
    converted = Tokenizer.from_file(tokenizer_json)
    ids, differences = [], []
    for index, text in enumerate(strings):
        expected = slow(text).input_ids
        ids.append(expected)
        got = converted.encode(text).ids
        if got != expected:
            special = any(token in text for token in (slow.eos_token, slow.unk_token))
            differences.append({"index": index, "converted_ids": got,
                                "reason": "special token text" if special else "combining marks"})
    return {"source": "Tests/Fixtures/tokenizers/real/strings.json", "ids": ids,
            "converted_differs": differences}


# Two shapes that differ in every dimension the Swift model reads from config.json, and in how the tokenizer is
# stored. The second's image size is not a multiple of its patch size, as so400m-patch14-384's is not (the
# convolution drops the last 4 pixels of each 60, as it drops the last 6 of 384). SiglipModel needs the vision attention-pooling head (vision_use_head false leaves get_image_features without
# a pooler_output and forward fails), so both have it; the text head projects to the vision width.
CHECKPOINTS = {
    "tiny-tanh-fp16": dict(
        dtype=torch.float16, logit_scale=2.3, logit_bias=-1.5, tokenizer_json=False, tokenizer={},
        text=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  projection_size=32),
        vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    image_size=32, patch_size=8),
        processor=dict(size={"height": 32, "width": 32}),
    ),
    "tiny-gelu-bf16": dict(
        dtype=torch.bfloat16, logit_scale=1.7, logit_bias=0.4, tokenizer_json=True,
        tokenizer=dict(model_input_names=["input_ids"], model_max_length=48),
        text=dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
                  hidden_act="gelu", layer_norm_eps=1e-5),
        vision=dict(hidden_size=48, intermediate_size=72, num_hidden_layers=3, num_attention_heads=3,
                    image_size=60, patch_size=14, hidden_act="gelu", layer_norm_eps=1e-5),
        processor=dict(size={"height": 60, "width": 60}, resample=Image.Resampling.BILINEAR,
                       image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711]),
    ),
}
HIDDEN_STATE_INDICES = [0, 1, -1]


def build(name, spec, spm, photo_dir):
    out = os.path.join(FIXTURES, "siglip", name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    write_tokenizer(SiglipTokenizer(vocab_file=spm, **spec["tokenizer"]), out, spec["tokenizer_json"])
    slow = SiglipTokenizer.from_pretrained(out)
    assert type(slow) is SiglipTokenizer and AutoTokenizer.from_pretrained(out).__class__ is SiglipTokenizer
    text = dict(vocab_size=len(slow), max_position_embeddings=64, pad_token_id=slow.pad_token_id,
                eos_token_id=slow.eos_token_id, bos_token_id=None, **spec["text"])
    config = SiglipConfig(text_config=text, vision_config=spec["vision"])
    torch.manual_seed(len(name))
    model = SiglipModel(config).eval()
    with torch.no_grad():  # random init zeroes them; make them tested numbers
        model.logit_scale.fill_(spec["logit_scale"])
        model.logit_bias.fill_(spec["logit_bias"])
        # Zero-initialized biases would hide a bias read from the wrong tensor.
        for key, value in model.named_parameters():
            if key.endswith("bias") and value.dim() == 1 and value.numel() > 1:
                value.normal_(0, 0.02)
    model.to(spec["dtype"]).save_pretrained(out)
    SiglipImageProcessorPil(**spec["processor"]).save_pretrained(out)

    # Reload exactly what was written, in fp32: the oracle's numbers are those of the stored weights.
    model = SiglipModel.from_pretrained(out, dtype=torch.float32).eval()
    processor = SiglipImageProcessorPil.from_pretrained(out)
    images = [load_image(os.path.join(photo_dir, p)).convert("RGB") for p in PHOTOS]
    pixels = processor(images=images, return_tensors="pt").pixel_values
    texts = [t for t in TEXTS if len(slow(t).input_ids) <= slow.model_max_length]
    assert texts == TEXTS or slow.model_max_length < 64
    text_inputs = slow(texts, padding="max_length", return_tensors="pt")
    assert text_inputs.input_ids.shape[1] == slow.model_max_length
    # What the zero-shot pipeline feeds the text tower.
    prompts = slow([TEMPLATE.format(l) for l in LABELS], padding="max_length", max_length=64, truncation=True,
                   return_tensors="pt")
    with torch.inference_mode():
        image_embeds = model.get_image_features(pixel_values=pixels).pooler_output
        text_embeds = model.get_text_features(**text_inputs).pooler_output
        logits_per_image = model(pixel_values=pixels, **prompts).logits_per_image
        hidden = model.vision_model(pixel_values=pixels[:1], output_hidden_states=True).hidden_states

    classifier = pipeline("zero-shot-image-classification", model=out, tokenizer=slow, image_processor=processor,
                          dtype=torch.float32)
    classified = [classifier(os.path.join(photo_dir, p), candidate_labels=LABELS, hypothesis_template=TEMPLATE)
                  for p in PHOTOS]
    too_long = len(slow(TEMPLATE.format(TOO_LONG_LABEL)).input_ids)
    assert too_long > 64

    tensors = {
        "pixel_values": pixels.contiguous(),
        "image_embeds": image_embeds.contiguous(),
        "text_embeds": text_embeds.contiguous(),
        "logits_per_image": logits_per_image.contiguous(),
    }
    for index in HIDDEN_STATE_INDICES:
        tensors[f"vision_hidden_states.{index}"] = hidden[index].contiguous()
    save_file(tensors, os.path.join(out, "expected.safetensors"))
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({
            "photos": PHOTOS,
            "texts": texts,
            "input_ids": text_inputs.input_ids.tolist(),
            "attention_mask": text_inputs["attention_mask"].tolist() if "attention_mask" in text_inputs else None,
            "labels": LABELS,
            "template": TEMPLATE,
            "prompt_ids": prompts.input_ids.tolist(),
            "prompt_mask": prompts["attention_mask"].tolist() if "attention_mask" in prompts else None,
            "too_long_label": TOO_LONG_LABEL,
            "too_long_tokens": too_long,
            "hidden_state_indices": HIDDEN_STATE_INDICES,
            "zero_shot": [{"image": p, "scores": c} for p, c in zip(PHOTOS, classified)],
        }, f, ensure_ascii=False, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spm", required=True, help="sentencepiece 0.2.3's test/botchan_en_unigram_1000.model")
    args = parser.parse_args()
    logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message="This sequence already has </s>")
    os.makedirs(os.path.join(FIXTURES, "siglip"), exist_ok=True)
    for name, spec in CHECKPOINTS.items():
        build(name, spec, args.spm, os.path.join(FIXTURES, "photos"))
    slow = SiglipTokenizer(vocab_file=args.spm)
    with tempfile.TemporaryDirectory() as converted:
        write_tokenizer(slow, converted, True)
        with open(os.path.join(FIXTURES, "siglip", "tokenizer-strings.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer_strings(slow, os.path.join(converted, "tokenizer.json")), f,
                      ensure_ascii=False, separators=(",", ":"))


if __name__ == "__main__":
    main()
