"""Gemma 3 image chat as llama.cpp's GGUF pair (`--model LM.gguf --mmproj MMPROJ.gguf`, what ollama and LM Studio
users have), made by llama.cpp's own converter from a tiny random-init Gemma3ForConditionalGeneration with a
SentencePiece tokenizer.model, with what transformers computes from that checkpoint.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt) and llama.cpp's source tree (the
llama-cpp-python 0.3.36 sdist on PyPI vendors it as vendor/llama.cpp; scripts/bench_serve.py unpacks it into
.build-llama-server/llama.cpp):

    LLAMA_CPP=.build-llama-server/llama.cpp python oracle/gemma3_gguf.py    # → Tests/Fixtures/gemma3-gguf/

The source checkpoint (a temporary directory; not committed):
- tokenizer.model: a SentencePiece BPE model trained here in Gemma's shape (the real one is not on PyPI): byte
  fallback, no dummy prefix, whitespace kept as it is (identity normalization, runs of spaces as pieces), digits
  split, ids 0-3 <pad> <eos> <bos> <unk>, then <mask>, <start_of_turn>, <end_of_turn>, <start_of_image> and
  <end_of_image> as user-defined pieces, 1000 pieces in all. The Hugging Face tokenizer is transformers'
  GemmaTokenizer converted from it, with <image_soft_token> added after the pieces (id 1000, as Gemma 3's 262144
  follows its 262144 pieces) and the turn and image markers special; config vocab_size 1004, so that the converter
  pads the GGUF vocabulary with three [PAD] tokens as it pads Gemma 3's 262208. tokenizer_config.json lists the added
  tokens (as older transformers wrote them, where the converter reads their types) and the runs of "▁" as plain
  added tokens, which the converter writes with real spaces: the spelling transformers' GGUF loader respells. (On
  this vocabulary, whose pieces never mix spaces with other characters, reading those tokens respelled or as added
  tokens of real spaces gives the same ids.)
- Gemma3Config: the SigLIP tower and projector of oracle/gemma3.py (32-pixel images, 4-pixel patches pooled to 16
  soft tokens per image); a Gemma 3 text decoder 32 wide with 6 layers in Gemma 3's own pattern (five sliding, the
  sixth full: llama.cpp's converter writes no layer types, its loader assumes every sixth), an 8-token window, 4
  query heads over 2 key/value heads of 8 with query_pre_attn_scalar 8 (llama.cpp scales by head_dim^-1/2 except for
  27B's 62 layers; transformers' GGUF loader assumes 256), and Gemma 3 4B's RoPE: linear scaling by 8 on the full
  layers over base 1,000,000, a base of its own (20,000 here, 10,000 in Gemma 3, so that reading the key matters)
  on the sliding ones. chat_template.jinja: oracle/gemma3.py's GEMMA3_TEMPLATE. generation_config.json: eos_token_id
  <eos> and <end_of_turn>, as Gemma 3's.

Files (llama.cpp's convert_hf_to_gguf.py, run under this process's python with llama.cpp's gguf-py on PYTHONPATH):
- lm-q8_0.gguf: `convert_hf_to_gguf.py SRC --outtype q8_0`: architecture gemma3, the SentencePiece vocabulary as
  tokenizer.ggml.model "llama" (scores, token types, add_space_prefix false), every norm weight stored plus one.
  Matrices whose rows are 32 long are q8_0; the others (rows of 16) fall back to f16.
- mmproj-f32.gguf: `convert_hf_to_gguf.py SRC --mmproj --outtype f32`: clip.projector_type gemma3, the SigLIP tower
  as v.*, mm.input_projection (forced f16 by the converter) and mm.soft_emb_norm (stored plus one),
  clip.vision.projector.scale_factor 2 (the pooling kernel; Gemma 3's 4 is not written).
- mmproj-no-projector-type.gguf: mmproj-f32.gguf less clip.projector_type (gguf-py's gguf_new_metadata.py), to be
  refused naming the key.

expected.json: transformers 5.23 runs the source model with every weight replaced by what the two files hold (read
back with gguf-py, dequantized, the norms' one taken off), so the pair must agree to fp32 rounding:
- "tokenizer": strings (chat markup, runs of spaces and newlines, bytes outside the vocabulary) with the source
  tokenizer's ids (add_special_tokens on); checked equal to transformers' own GGUF tokenizer (gguf_file=lm-q8_0.gguf).
- "pixel_values": chelsea.png through the source's Gemma3ImageProcessorPil, flattened.
- "requests" (as oracle/gemma3.py's): prompt, images, input_ids, image_features, logits at the first, middle and last
  image token, the token after the image and the last position, greedy (10 new tokens: ids, stripped text, min margin).
- "chat": conversations through the checkpoint's chat template (the one lm-q8_0.gguf carries) and Gemma3Processor:
  rendered prompt, input_ids, greedy 8 new tokens (ids, text not stripped, min margin). The last is one user turn of
  an image and a question, as `vlm generate --image --prompt` lays it out.
- "text_only": a text prompt (no image, no template) through the tokenizer with its bos and the model's greedy 10 new
  tokens: what `vlm generate --model lm-q8_0.gguf --prompt` continues.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import (AddedToken, AutoProcessor, AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration,
                          Gemma3ImageProcessorPil, Gemma3Processor)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemma3 import (CAMERA, CHELSEA, GEMMA3_TEMPLATE, IMAGE_PROCESSOR, IMAGE_SEQ_LENGTH, IMAGE_TOKENS, TALL,  # noqa: E402
                    TURN_TOKENS, VISION, WIDE, greedy, photo, published_layout, randomize, system)
from image_chat import absolute, assistant, image, text, user  # noqa: E402
from tokenizer_fixtures import corpus  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
OUT = os.path.join(FIXTURES, "gemma3-gguf")
LLAMA_CPP = os.path.abspath(os.environ.get("LLAMA_CPP", os.path.join(ROOT, ".build-llama-server", "llama.cpp")))
SEED = 5
NEW_TOKENS = 10
CHAT_TOKENS = 8
PIECES = 1000
VOCAB_SIZE = PIECES + 4

TEXT = dict(model_type="gemma3_text", hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=8, max_position_embeddings=512,
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 20000.0}})
MARKERS = ["<mask>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>"]

REQUESTS = [
    ([CHELSEA], [user(image(CHELSEA), text("What is shown in this image?"))]),
    ([WIDE, CAMERA], "<start_of_image><start_of_image> What differs between these?"),
]
CONVERSATIONS = [
    [system("You are terse."), user(image(CHELSEA), text("What is in this picture?"))],
    [user(image(CAMERA), text("Describe it.")), assistant("A camera man."), user(image(TALL), text("And this one?"))],
    [user(image(WIDE), text("Describe this image."))],
]
# Longer than the 8-token window (a byte per character outside the small vocabulary): the sliding layers' base and
# the full layer's scaled RoPE both act.
TEXT_PROMPT = "The quick brown fox jumps over the lazy dog."
TOKENIZER_STRINGS = [
    "<start_of_turn>user\nHello there.<end_of_turn>\n<start_of_turn>model\n",
    "\n\n<start_of_image><image_soft_token><image_soft_token><end_of_image>\n\n",
    "many     spaces   and\t\ttabs\n\n\nnewlines\r\n", " leading and trailing ", "", "   ",
    "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it?",
    "Ünïcödé façade — naïve café; こんにちは世界 emoji 😀", "12345678901234567890 3.14159",
    "<bos>in the text<eos><pad><unk><mask>", "[PAD1001] is not a token",
]


def run_llama_cpp(*args):
    env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py"))
    result = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{args[0]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def train_tokenizer(directory):
    import sentencepiece as spm

    corpus_path = os.path.join(directory, "corpus.txt")
    with open(corpus_path, "w", encoding="utf-8") as file:
        for line in corpus(3, 4000):
            file.write(line + "\n")
    spm.SentencePieceTrainer.train(
        input=corpus_path, model_prefix=os.path.join(directory, "tokenizer"), vocab_size=PIECES, model_type="bpe",
        byte_fallback=True, character_coverage=0.98, normalization_rule_name="identity", add_dummy_prefix=False,
        remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True, pad_id=0, eos_id=1,
        bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        user_defined_symbols=MARKERS, minloglevel=2)
    return os.path.join(directory, "tokenizer.model")


def build_source(directory):
    os.makedirs(directory)
    shutil.copy(train_tokenizer(tempfile.mkdtemp()), directory)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as file:
        json.dump({"tokenizer_class": "GemmaTokenizer", "add_bos_token": True}, file)
    tok = AutoTokenizer.from_pretrained(directory, extra_special_tokens=IMAGE_TOKENS)
    assert len(tok) == PIECES + 1, len(tok)
    tok.add_special_tokens({"additional_special_tokens": [AddedToken(t, special=True, normalized=False)
                                                          for t in TURN_TOKENS]})
    image_token = tok.image_token_id
    assert image_token == PIECES, image_token
    processor = Gemma3Processor(image_processor=Gemma3ImageProcessorPil(**IMAGE_PROCESSOR), tokenizer=tok,
                                chat_template=GEMMA3_TEMPLATE, image_seq_length=IMAGE_SEQ_LENGTH)
    text_config = dict(TEXT, vocab_size=VOCAB_SIZE, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id)
    config = Gemma3Config(vision_config=VISION, text_config=text_config, mm_tokens_per_image=IMAGE_SEQ_LENGTH,
                          boi_token_index=tok.boi_token_id, eoi_token_index=tok.eoi_token_id, image_token_index=image_token)
    torch.manual_seed(SEED)
    model = Gemma3ForConditionalGeneration(config).eval()
    randomize(model, torch.Generator().manual_seed(SEED))
    model.tie_weights()
    assert model.config.text_config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    # Gemma 3's generation_config.json ends generation at <eos> and <end_of_turn> ([1, 106]).
    model.generation_config.eos_token_id = [tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_turn>")]
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    # The added tokens as the published tokenizer_config.json lists them (older transformers wrote them there; 5.23
    # keeps them in tokenizer.json only): llama.cpp's converter reads their types from there, and finds
    # <image_soft_token>, which is no SentencePiece piece, nowhere else.
    path = os.path.join(directory, "tokenizer_config.json")
    with open(path) as file:
        saved = json.load(file)
    saved["added_tokens_decoder"] = {
        str(i): dict(content=t.content, lstrip=t.lstrip, normalized=t.normalized, rstrip=t.rstrip,
                     single_word=t.single_word, special=t.special) for i, t in sorted(tok.added_tokens_decoder.items())}
    # Runs of "▁" listed as plain added tokens too: the converter writes those with real spaces ("pre-normalize
    # user-defined spaces"), the spelling transformers' GGUF loader respells for Gemma files.
    for piece, i in sorted(tok.get_vocab().items(), key=lambda item: item[1]):
        if len(piece) > 1 and set(piece) == {"\u2581"}:
            saved["added_tokens_decoder"][str(i)] = dict(content=piece, lstrip=False, normalized=False, rstrip=False,
                                                         single_word=False, special=False)
    with open(path, "w") as file:
        json.dump(saved, file, indent=2)
    # The published layout (`vision_tower.vision_model.…`), which the converter's tensor map keys on.
    path = os.path.join(directory, "model.safetensors")
    save_file({published_layout(k): v for k, v in load_file(path).items()}, path, metadata={"format": "pt"})


def convert(source):
    lm, mmproj = os.path.join(OUT, "lm-q8_0.gguf"), os.path.join(OUT, "mmproj-f32.gguf")
    script = os.path.join(LLAMA_CPP, "convert_hf_to_gguf.py")
    run_llama_cpp(script, source, "--outtype", "q8_0", "--outfile", lm)
    run_llama_cpp(script, source, "--mmproj", "--outtype", "f32", "--outfile", mmproj)
    run_llama_cpp(os.path.join(LLAMA_CPP, "gguf-py", "gguf", "scripts", "gguf_new_metadata.py"), mmproj,
                  os.path.join(OUT, "mmproj-no-projector-type.gguf"), "--remove-metadata", "clip.projector_type",
                  "--force")
    return lm, mmproj


def gguf_reader():
    sys.path.insert(0, os.path.join(LLAMA_CPP, "gguf-py"))
    import gguf
    return gguf


def stored_weights(lm, mmproj, model):
    """The model's state dict with every weight as the two files hold it (dequantized; norms less their one)."""
    gguf = gguf_reader()

    def tensors(path):
        return {t.name: torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
                                         .reshape([int(d) for d in reversed(t.shape)]))
                for t in gguf.GGUFReader(path).tensors}

    text_modules = {"attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
                    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
                    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
                    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                    "ffn_down": "mlp.down_proj"}
    vision_modules = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                      "attn_out": "self_attn.out_proj", "ln1": "layer_norm1", "ln2": "layer_norm2",
                      "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"}
    fixed = {"token_embd.weight": "model.language_model.embed_tokens.weight",
             "output_norm.weight": "model.language_model.norm.weight",
             "v.patch_embd.weight": "model.vision_tower.vision_model.embeddings.patch_embedding.weight",
             "v.patch_embd.bias": "model.vision_tower.vision_model.embeddings.patch_embedding.bias",
             "v.position_embd.weight": "model.vision_tower.vision_model.embeddings.position_embedding.weight",
             "v.post_ln.weight": "model.vision_tower.vision_model.post_layernorm.weight",
             "v.post_ln.bias": "model.vision_tower.vision_model.post_layernorm.bias",
             "mm.input_projection.weight": "model.multi_modal_projector.mm_input_projection_weight",
             "mm.soft_emb_norm.weight": "model.multi_modal_projector.mm_soft_emb_norm.weight"}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assigned = set()
    for path, gemma_norms in ((lm, True), (mmproj, False)):
        for name, value in tensors(path).items():
            parts = name.split(".")
            if name in fixed:
                hf = fixed[name]
            elif parts[0] == "blk":
                hf = f"model.language_model.layers.{parts[1]}.{text_modules[parts[2]]}.{parts[3]}"
            elif parts[:2] == ["v", "blk"]:
                hf = f"model.vision_tower.vision_model.encoder.layers.{parts[2]}.{vision_modules[parts[3]]}.{parts[4]}"
            else:
                raise SystemExit(f"unmapped tensor {name} in {path}")
            if hf.endswith("norm.weight") and (gemma_norms or "soft_emb_norm" in hf):
                value = value - 1
            hf_key = hf if hf in state else hf.replace("vision_tower.vision_model.", "vision_tower.")
            assert hf_key in state, hf
            source = state[hf_key]
            if "token_embd" in name:
                # The converter keeps the padded rows; transformers' embeddings have them too.
                assert value.shape == source.shape, (name, value.shape, source.shape)
            assert value.shape == source.shape, (name, tuple(value.shape), tuple(source.shape))
            error = (value - source).abs().max().item()
            assert error < 0.02 * max(source.abs().max().item(), 1e-3), (name, error)
            state[hf_key] = value
            assigned.add(hf_key)
    missing = [k for k in state if k not in assigned and k != "lm_head.weight"]
    assert not missing, missing
    state["lm_head.weight"] = state["model.language_model.embed_tokens.weight"]
    return state


def request_record(model, processor, images, prompt, config):
    messages = None
    if not isinstance(prompt, str):
        messages, prompt = prompt, processor.apply_chat_template(prompt, add_generation_prompt=True)
    inputs = processor(images=[[photo(p) for p in images]], text=[prompt], return_tensors="pt")
    ids = inputs.input_ids[0].tolist()
    with torch.no_grad():
        features = model.model.get_image_features(inputs.pixel_values).pooler_output
        logits = model(**inputs).logits[0]
    image_positions = [i for i, token in enumerate(ids) if token == config.image_token_index]
    first = image_positions[:IMAGE_SEQ_LENGTH]
    positions = [first[0], first[len(first) // 2], first[-1], first[-1] + 1, len(ids) - 1]
    record = dict(prompt=prompt, images=images, input_ids=ids, image_features=[f.tolist() for f in features],
                  logits_positions=positions, logits=logits[positions].tolist(),
                  greedy=greedy(model, processor, inputs, NEW_TOKENS, strip=True))
    return dict(messages=messages, **record) if messages is not None else record


def chat_record(model, processor, messages):
    inputs = processor.apply_chat_template(absolute(messages), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt")
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    return dict(messages=messages, prompt=prompt, input_ids=inputs.input_ids[0].tolist(),
                **greedy(model, processor, inputs, CHAT_TOKENS, strip=False))


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    source = os.path.join(tempfile.mkdtemp(), "gemma3-tiny")
    build_source(source)
    lm, mmproj = convert(source)

    processor = AutoProcessor.from_pretrained(source)
    tokenizer = processor.tokenizer
    gguf_tokenizer = AutoTokenizer.from_pretrained(OUT, gguf_file="lm-q8_0.gguf")
    strings = []
    for string in TOKENIZER_STRINGS:
        ids = tokenizer(string).input_ids
        assert gguf_tokenizer(string).input_ids == ids, (string, ids, gguf_tokenizer(string).input_ids)
        strings.append(dict(text=string, ids=ids))

    model = Gemma3ForConditionalGeneration.from_pretrained(source, dtype=torch.float32).eval()
    config = model.config
    model.load_state_dict(stored_weights(lm, mmproj, model))
    model.tie_weights()

    requests = [request_record(model, processor, images, prompt, config) for images, prompt in REQUESTS]
    chat = [chat_record(model, processor, messages) for messages in CONVERSATIONS]
    text_inputs = tokenizer(TEXT_PROMPT, return_tensors="pt")
    text_only = dict(prompt=TEXT_PROMPT, input_ids=text_inputs.input_ids[0].tolist(),
                     **greedy(model, processor, text_inputs, NEW_TOKENS, strip=False))
    margins = ([r["greedy"]["min_margin"] for r in requests] + [c["min_margin"] for c in chat]
               + [text_only["min_margin"]])
    assert min(margins) > 1e-3, f"near-tie ({min(margins)}), pick another seed"
    pixel_values = processor.image_processor(photo(CHELSEA), return_tensors="pt").pixel_values
    expected = dict(image_token_index=config.image_token_index, max_new_tokens=NEW_TOKENS, chat_tokens=CHAT_TOKENS,
                    tokenizer=strings, pixel_values=dict(image=CHELSEA, shape=list(pixel_values.shape),
                                                         values=pixel_values.reshape(-1).tolist()),
                    requests=requests, chat=chat, text_only=text_only)
    with open(os.path.join(OUT, "expected.json"), "w") as file:
        json.dump(expected, file, ensure_ascii=False, separators=(",", ":"))

    gguf = gguf_reader()
    for path in (lm, mmproj):
        reader = gguf.GGUFReader(path)
        print(os.path.basename(path), sorted({t.tensor_type.name for t in reader.tensors}),
              [k for k in reader.fields if not k.startswith("tokenizer.ggml.")])
    for r in requests:
        print("request", r["images"], f"{len(r['input_ids'])} tokens", r["greedy"])
    for c in chat:
        print("chat", f"{len(c['input_ids'])} tokens", c["ids"], repr(c["text"]), f"margin {c['min_margin']:.4f}")
    print(f"min margin {min(margins):.4f}")
    print({f: os.path.getsize(os.path.join(OUT, f)) for f in sorted(os.listdir(OUT))})


if __name__ == "__main__":
    main()
