"""Image-to-text fixtures at the level a user meets: checkpoints with real tokenizers and processor configs, as
transformers saves them, and what processor + generate + decoding give for real photos.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt):

    python oracle/image_to_text.py    # → Tests/Fixtures/image-to-text/<case>/

"blip2-opt": a tiny random-init Blip2ForConditionalGeneration (OPT language model) with the real GPT-2 byte-level
BPE (Tests/Fixtures/tokenizers/real/gpt2, the vocabulary OPT's tokenizer is built on; bos/eos `<|endoftext|>` added
in front of a prompt as OPT's tokenizer adds `</s>`) plus the `<image>` token Blip2Processor adds, saved with
Blip2Processor.save_pretrained (BlipImageProcessor at the tiny image size, num_query_tokens).

"blip2-flan-t5": the same with a Flan-T5-style language model (gated-GELU T5, its own lm_head) and a T5-style
SentencePiece Unigram tokenizer (Tests/Fixtures/tokenizers/t5-style, `</s>` appended) plus `<image>`. Without a prompt
the encoder reads the image tokens alone (transformers 5.23's generate() cannot caption without a prompt there: it
appends T5's bos token, which is None), recorded by passing those image tokens as input_ids. "blip2-t5-bf16": the
original T5's shape instead (ReLU MLP, lm_head tied to the shared embedding with decoder outputs scaled by
d_model^-0.5, 3 heads of 8 over a 16-wide model), weights stored as bf16.

"blip-captioning", "blip-vqa", "blip-retrieval": tiny random-init BLIP heads with BLIP's real tokenizer: the
bert-base-uncased WordPiece (Tests/Fixtures/tokenizers/real/bert-uncased) with "[DEC]" as bos and "[ENC]" added, as
the Salesforce checkpoints have it (30524 ids), saved with BlipProcessor.save_pretrained.

"blip2-retrieval": a tiny random-init Blip2ForImageTextRetrieval whose Q-Former reads text in that same BLIP
vocabulary plus `<image>`, saved with Blip2Processor and num_query_tokens, as blip2-itm-vit-g is: the processor puts
the image tokens in front of each text's [CLS] and the model, given image_token_index, cuts them off again; fp16
weights.

expected.json lists, per request (one image, an optional prompt or question): the processor's input_ids (image
tokens expanded in front of the text for BLIP-2; [CLS] … [SEP] for BLIP), the new tokens of greedy decoding and of
3-beam search, and their text as the image-text-to-text pipeline returns it (decoded with special tokens skipped,
stripped). For retrieval: per image and text, the ITM match probability and the ITC cosine similarity.
"""
import json
import os
import shutil

import torch
from PIL import Image
from transformers import (AutoTokenizer, Blip2Config, PreTrainedTokenizerFast, Blip2ForConditionalGeneration,
                          Blip2ForImageTextRetrieval, Blip2Processor, BlipConfig,
                          BlipForConditionalGeneration, BlipForImageTextRetrieval, BlipForQuestionAnswering,
                          BlipImageProcessorPil, BlipProcessor)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures", "image-to-text")
PHOTOS = os.path.join(ROOT, "Tests", "Fixtures", "photos")
GPT2 = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real", "gpt2")
BERT = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "real", "bert-uncased")
T5_STYLE = os.path.join(ROOT, "Tests", "Fixtures", "tokenizers", "t5-style", "tokenizer.json")
NEW_TOKENS = 12

REQUESTS = [("chelsea.png", None), ("coffee.png", None), ("chelsea.png", "a photo of"),
            ("coffee.png", "Question: what is in the cup? Answer:")]


def randomize(model, generator):
    """Every parameter drawn (transformers' init leaves the query tokens and the vision tower near zero)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if "norm" in name.lower() and name.endswith("weight"):
                parameter.copy_(1 + 0.1 * noise)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_((0.5 if name.startswith("language_model.") else 0.2) * noise)


def compact_json(path):
    """Rewrites a JSON file without indentation (tokenizer.json shrinks by a third)."""
    with open(path) as file:
        content = json.load(file)
    with open(path, "w") as file:
        json.dump(content, file, ensure_ascii=False, separators=(",", ":"))


def generations(model, processor, inputs, prompt_length):
    """Greedy and 3-beam new tokens with their text, and the greedy steps' smallest top-1/top-2 margin."""
    record = {}
    for mode, settings in (("greedy", dict(do_sample=False)), ("beam", dict(do_sample=False, num_beams=3))):
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, output_logits=mode == "greedy",
                                 return_dict_in_generate=True, **settings)
        ids = out.sequences[0, prompt_length:].tolist()
        record[mode] = dict(ids=ids, text=processor.decode(ids, skip_special_tokens=True).strip())
        if mode == "greedy":
            record[mode]["min_margin"] = min((top[:, 0] - top[:, 1]).min().item()
                                             for top in (logits.topk(2, dim=-1).values for logits in out.logits))
    return record


FLAN_T5 = dict(d_model=16, d_kv=8, d_ff=32, num_layers=2, num_decoder_layers=2, num_heads=2,
               feed_forward_proj="gated-gelu", tie_word_embeddings=False)
ORIGINAL_T5 = dict(d_model=16, d_kv=8, d_ff=40, num_layers=2, num_decoder_layers=2, num_heads=3,
                   feed_forward_proj="relu", tie_word_embeddings=True)


def blip2_t5(name, text, dtype, seed):
    directory = os.path.join(FIXTURES, name)
    shutil.rmtree(directory, ignore_errors=True)
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=T5_STYLE, eos_token="</s>", unk_token="<unk>", pad_token="<unk>")
    processor = Blip2Processor(image_processor=BlipImageProcessorPil(size={"height": 32, "width": 32}),
                               tokenizer=tokenizer, num_query_tokens=4)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    config = Blip2Config(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8, qkv_bias=True),
        qformer_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                            cross_attention_frequency=2),
        text_config=dict(text, model_type="t5", vocab_size=len(processor.tokenizer), decoder_start_token_id=0,
                         pad_token_id=0, eos_token_id=processor.tokenizer.eos_token_id),
        num_query_tokens=4, image_token_index=image_token)
    torch.manual_seed(seed)
    model = Blip2ForConditionalGeneration(config).eval()
    randomize(model, torch.Generator().manual_seed(seed))
    model.to(dtype).save_pretrained(directory)
    processor.save_pretrained(directory)
    model = Blip2ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    processor = Blip2Processor.from_pretrained(directory)
    records = []
    for photo, prompt in REQUESTS:
        image = Image.open(os.path.join(PHOTOS, photo)).convert("RGB")
        if prompt is None:
            inputs = processor(images=image, return_tensors="pt")
            inputs["input_ids"] = torch.tensor([[image_token] * config.num_query_tokens])
        else:
            inputs = processor(images=image, text=prompt, return_tensors="pt")
        record = dict(image=photo, prompt=prompt)
        if prompt is not None:
            record["input_ids"] = inputs.input_ids[0].tolist()
        # The decoder's sequences start with decoder_start_token_id.
        record.update(generations(model, processor, inputs, prompt_length=1))
        records.append(record)
    assert min(r["greedy"]["min_margin"] for r in records) > 1e-3, f"{name}: near-tie, pick another seed"
    write(directory, dict(max_new_tokens=NEW_TOKENS, image_token_index=image_token, requests=records))


def blip_tokenizer():
    """bert-base-uncased as BLIP extends it: "[DEC]" (bos) and "[ENC]" appended."""
    tokenizer = AutoTokenizer.from_pretrained(BERT, bos_token="[DEC]")
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tokenizer


BLIP_TEXT = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                 max_position_embeddings=64)
BLIP_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                   patch_size=8)


def blip_checkpoint(name, model_class, seed):
    """A tiny random-init BLIP head saved with BlipProcessor (fp16 weights), reloaded to compute in fp32."""
    directory = os.path.join(FIXTURES, name)
    shutil.rmtree(directory, ignore_errors=True)
    processor = BlipProcessor(image_processor=BlipImageProcessorPil(size={"height": 32, "width": 32}),
                              tokenizer=blip_tokenizer())
    tokenizer = processor.tokenizer
    config = BlipConfig(text_config=dict(BLIP_TEXT, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                         pad_token_id=tokenizer.pad_token_id, sep_token_id=tokenizer.sep_token_id),
                        vision_config=BLIP_VISION, image_text_hidden_size=16)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    randomize(model, torch.Generator().manual_seed(seed))
    model.to(torch.float16).save_pretrained(directory)
    processor.save_pretrained(directory)
    return (directory, model_class.from_pretrained(directory, dtype=torch.float32).eval(),
            BlipProcessor.from_pretrained(directory))


def blip(name, model_class, requests, seed):
    directory, model, processor = blip_checkpoint(name, model_class, seed)
    records = []
    for photo, text in requests:
        image = Image.open(os.path.join(PHOTOS, photo)).convert("RGB")
        inputs = processor(images=image, text=text, return_tensors="pt")
        record = dict(image=photo, prompt=text)
        if text is not None:
            record["input_ids"] = inputs.input_ids[0].tolist()
        # Captioning hands back the decoder's prompt ([DEC] + the prompt without [CLS] and [SEP]) first; VQA the [DEC]
        # it starts the answer from.
        if model_class is BlipForConditionalGeneration:
            prompt_length = 1 if text is None else inputs.input_ids.shape[1] - 1
        else:
            prompt_length = 1
        record.update(generations(model, processor, inputs, prompt_length))
        records.append(record)
    assert min(r["greedy"]["min_margin"] for r in records) > 1e-3, f"{name}: near-tie, pick another seed"
    write(directory, dict(max_new_tokens=NEW_TOKENS, requests=records))


RETRIEVAL_TEXTS = ["a cat lying on a blanket", "a cup of coffee", "two monsters sitting around a campfire"]


def write_retrieval(directory, processor, itm, itc):
    """Every photo against every text: `itm(inputs)`, the match probabilities, and `itc(inputs)`, the contrastive
    scores, for a batch of one photo repeated per text."""
    pairs = []
    for photo in ("chelsea.png", "coffee.png"):
        image = Image.open(os.path.join(PHOTOS, photo)).convert("RGB")
        inputs = processor(images=[image] * len(RETRIEVAL_TEXTS), text=RETRIEVAL_TEXTS, return_tensors="pt", padding=True)
        with torch.no_grad():
            matches, scores = itm(inputs), itc(inputs)
        pairs += [dict(image=photo, text=text, itm=float(matches[i]), itc=float(scores[i]))
                  for i, text in enumerate(RETRIEVAL_TEXTS)]
    write(directory, dict(texts=RETRIEVAL_TEXTS, pairs=pairs))


def blip_retrieval(seed=5):
    directory, model, processor = blip_checkpoint("blip-retrieval", BlipForImageTextRetrieval, seed)
    write_retrieval(directory, processor, lambda inputs: model(**inputs, use_itm_head=True).itm_score.softmax(dim=-1)[:, 1],
                    lambda inputs: model(**inputs, use_itm_head=False).itm_score[0])


def blip2_retrieval(seed=13):
    directory = os.path.join(FIXTURES, "blip2-retrieval")
    shutil.rmtree(directory, ignore_errors=True)
    processor = Blip2Processor(image_processor=BlipImageProcessorPil(size={"height": 32, "width": 32}),
                               tokenizer=blip_tokenizer(), num_query_tokens=4)
    tokenizer = processor.tokenizer
    config = Blip2Config(vision_config=dict(BLIP_VISION, qkv_bias=True),
                         qformer_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                             num_attention_heads=2, cross_attention_frequency=1,
                                             vocab_size=len(tokenizer), max_position_embeddings=64,
                                             pad_token_id=tokenizer.pad_token_id, use_qformer_text_input=True),
                         num_query_tokens=4, image_text_hidden_size=16,
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"))
    torch.manual_seed(seed)
    model = Blip2ForImageTextRetrieval(config).eval()
    randomize(model, torch.Generator().manual_seed(seed))
    model.to(torch.float16).save_pretrained(directory)
    processor.save_pretrained(directory)
    model = Blip2ForImageTextRetrieval.from_pretrained(directory, dtype=torch.float32).eval()
    write_retrieval(directory, Blip2Processor.from_pretrained(directory),
                    lambda inputs: model(**inputs, use_image_text_matching_head=True).logits_per_image.softmax(dim=-1)[:, 1],
                    lambda inputs: model(**inputs, use_image_text_matching_head=False).logits_per_image[0])


def write(directory, expected):
    compact_json(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "expected.json"), "w") as file:
        json.dump(expected, file, indent=1)
    print(os.path.basename(directory), {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))})


def blip2_opt(seed=7):
    directory = os.path.join(FIXTURES, "blip2-opt")
    shutil.rmtree(directory, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(GPT2, add_bos_token=True)
    processor = Blip2Processor(image_processor=BlipImageProcessorPil(size={"height": 32, "width": 32}),
                               tokenizer=tokenizer, num_query_tokens=4)
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    eos = processor.tokenizer.eos_token_id
    config = Blip2Config(
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=32, patch_size=8, qkv_bias=True),
        qformer_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                            cross_attention_frequency=1),
        text_config=dict(vocab_size=len(processor.tokenizer), hidden_size=16, word_embed_proj_dim=16, ffn_dim=32,
                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64,
                         bos_token_id=eos, eos_token_id=eos, pad_token_id=eos),
        num_query_tokens=4, image_token_index=image_token)
    torch.manual_seed(seed)
    model = Blip2ForConditionalGeneration(config).eval()
    randomize(model, torch.Generator().manual_seed(seed))
    model.to(torch.float16).save_pretrained(directory)
    processor.save_pretrained(directory)
    compact_json(os.path.join(directory, "tokenizer.json"))
    model = Blip2ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32).eval()
    processor = Blip2Processor.from_pretrained(directory)

    requests = []
    for photo, prompt in REQUESTS:
        image = Image.open(os.path.join(PHOTOS, photo)).convert("RGB")
        inputs = processor(images=image, text=prompt, return_tensors="pt")
        record = dict(image=photo, prompt=prompt)
        if prompt is not None:
            record["input_ids"] = inputs.input_ids[0].tolist()
        for mode, settings in (("greedy", dict(do_sample=False)), ("beam", dict(do_sample=False, num_beams=3))):
            with torch.no_grad():
                out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, output_logits=mode == "greedy",
                                     return_dict_in_generate=True, **settings)
            # generate() returns the prompt (or the image tokens + bos it made up) in front of the new tokens.
            prompt_length = inputs.input_ids.shape[1] if prompt is not None else config.num_query_tokens + 1
            ids = out.sequences[0, prompt_length:].tolist()
            record[mode] = dict(ids=ids, text=processor.decode(ids, skip_special_tokens=True).strip())
            if mode == "greedy":
                margins = [(top[:, 0] - top[:, 1]).min().item()
                           for top in (logits.topk(2, dim=-1).values for logits in out.logits)]
                record[mode]["min_margin"] = min(margins)
        requests.append(record)
    assert min(r["greedy"]["min_margin"] for r in requests) > 1e-3, "near-tie: pick another seed"
    with open(os.path.join(directory, "expected.json"), "w") as file:
        json.dump(dict(max_new_tokens=NEW_TOKENS, image_token_index=image_token, requests=requests), file, indent=1)
    print("blip2-opt", {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))})


if __name__ == "__main__":
    blip2_opt()
    blip2_t5("blip2-flan-t5", FLAN_T5, torch.float16, seed=11)
    blip2_t5("blip2-t5-bf16", ORIGINAL_T5, torch.bfloat16, seed=12)
    blip("blip-captioning", BlipForConditionalGeneration,
         [("chelsea.png", None), ("coffee.png", None), ("chelsea.png", "a picture of")], seed=3)
    blip("blip-vqa", BlipForQuestionAnswering,
         [("chelsea.png", "how many cats are there?"), ("coffee.png", "what is in the cup?")], seed=4)
    blip_retrieval()
    blip2_retrieval()
