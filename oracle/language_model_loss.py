"""Language-model losses: transformers' `labels=` loss on the decoder fixtures, and the perplexity of a real text.

Run by hand from the repository root with the oracle venv (oracle/requirements.txt), after oracle/decoders.py and
oracle/llama.py have written their checkpoints:

    python oracle/language_model_loss.py [--smollm2 PATH.gguf]

Tests/Fixtures/decoders/loss.json: for tiny checkpoints of every decoder family, `model(input_ids, attention_mask,
labels=labels).loss` for a right-padded batch whose labels leave out each row's prompt and padding with -100 (as
supervised fine-tuning masks them), and for one unpadded row whose every label counts.

Tests/Fixtures/llama/smollm2-prompt-logprobs.json (with --smollm2): each token's log-probability given those before it
and the two most likely tokens at each position, for a prompt under SmolLM2-135M-Instruct Q4_1 (what OpenAI's
completions return for the prompt with `echo` and `logprobs`), then the greedy next token's.

Tests/Fixtures/llama/smollm2-perplexity.json (with --smollm2): the perplexity of a passage of public-domain prose
under SmolLM2-135M-Instruct Q4_1 (dequantized to fp32, as transformers loads GGUF files), by the strided
sliding-window recipe of transformers' perplexity guide: windows of `context` tokens starting every `stride` tokens,
each scoring the tokens the previous one did not reach (the others' labels -100). The guide counts each window's
scored tokens as its unmasked labels less one, which undercounts every window after the first by one; here each
window's mean loss is weighted by the tokens it really scores, so every token after the first is scored exactly once.
"""
import argparse
import json
import os

import torch
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "Tests", "Fixtures")
IGNORED = -100
CHECKPOINTS = ["decoders/qwen2", "decoders/qwen3", "decoders/smollm3", "decoders/gemma3", "decoders/mistral-sliding",
               "decoders/opt-pre", "decoders/gpt2", "llama/gqa-untied", "llama/llama3-tied"]

# The opening of Jane Austen's "Pride and Prejudice" (1813, public domain).
PASSAGE = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a "
    "wife.\n\nHowever little known the feelings or views of such a man may be on his first entering a neighbourhood, "
    "this truth is so well fixed in the minds of the surrounding families, that he is considered the rightful "
    "property of some one or other of their daughters.\n\n\u201cMy dear Mr. Bennet,\u201d said his lady to him one "
    "day, \u201chave you heard that Netherfield Park is let at last?\u201d\n\nMr. Bennet replied that he had not.\n\n"
    "\u201cBut it is,\u201d returned she; \u201cfor Mrs. Long has just been here, and she told me all about it.\u201d"
    "\n\nMr. Bennet made no answer.\n\n\u201cDo you not want to know who has taken it?\u201d cried his wife "
    "impatiently.\n\n\u201cYou want to tell me, and I have no objection to hearing it.\u201d\n\nThis was invitation "
    "enough.\n\n\u201cWhy, my dear, you must know, Mrs. Long says that Netherfield is taken by a young man of large "
    "fortune from the north of England; that he came down on Monday in a chaise and four to see the place, and was so "
    "much delighted with it, that he agreed with Mr. Morris immediately; that he is to take possession before "
    "Michaelmas, and some of his servants are to be in the house by the end of next week.\u201d")


def losses(checkpoint):
    model = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, checkpoint), dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    # Three rows of 12 positions, the last two right-padded to 9 and 6 tokens; prompts of 4, 2 and 3 tokens.
    ids = torch.randint(3, vocab, (3, 12), generator=generator)
    lengths, prompts = [12, 9, 6], [4, 2, 3]
    mask = torch.tensor([[1 if t < n else 0 for t in range(12)] for n in lengths])
    ids = ids.masked_fill(mask == 0, model.config.pad_token_id)
    labels = ids.clone()
    for row, (n, p) in enumerate(zip(lengths, prompts)):
        labels[row, :p] = IGNORED
        labels[row, n:] = IGNORED
    single = torch.randint(3, vocab, (1, 10), generator=generator)
    with torch.no_grad():
        batch_loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
        single_loss = model(input_ids=single, labels=single).loss.item()
    return dict(checkpoint=checkpoint, input_ids=ids.tolist(), attention_mask=mask.tolist(), labels=labels.tolist(),
                loss=batch_loss, single_ids=single[0].tolist(), single_loss=single_loss)


def perplexity(path, context=128, stride=64):
    from transformers import AutoTokenizer
    directory, file = os.path.split(path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32).eval()
    ids = tokenizer(PASSAGE, return_tensors="pt").input_ids
    length = ids.shape[1]
    windows, nll_sum, scored_total, previous_end = [], 0.0, 0, 0
    for begin in range(0, length, stride):
        end = min(begin + context, length)
        target = end - previous_end
        window = ids[:, begin:end]
        labels = window.clone()
        labels[:, :-target] = IGNORED
        with torch.no_grad():
            loss = model(input_ids=window, labels=labels).loss.item()
        # Labels are shifted by one inside the loss: position 0's label is never scored.
        scored = int((labels[:, 1:] != IGNORED).sum())
        windows.append(dict(begin=begin, end=end, loss=loss, scored=scored))
        nll_sum += loss * scored
        scored_total += scored
        previous_end = end
        if end == length:
            break
    nll = nll_sum / scored_total
    print(f"{length} tokens, {len(windows)} windows, nll {nll:.6f}, perplexity {torch.exp(torch.tensor(nll)).item():.4f}")
    return dict(file=file, text=PASSAGE, input_ids=ids[0].tolist(), context=context, stride=stride, windows=windows,
                scored=scored_total, nll=nll, perplexity=float(torch.exp(torch.tensor(nll, dtype=torch.float64))))


def prompt_logprobs(path, text="The capital of France is Paris, and the capital of Italy is", top=2):
    """Each prompt token's log-probability given those before it, and the `top` most likely tokens there (OpenAI's
    completions with echo and logprobs), then the greedy next token's."""
    from transformers import AutoTokenizer
    directory, file = os.path.split(path)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=file, dtype=torch.float32).eval()
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    positions = []
    for position in range(1, ids.shape[1] + 1):
        row = logprobs[position - 1]
        best = row.topk(top)
        token = ids[0, position].item() if position < ids.shape[1] else best.indices[0].item()
        positions.append(dict(token=token, logprob=row[token].item(), top_ids=best.indices.tolist(),
                              top_logprobs=best.values.tolist()))
    return dict(file=file, text=text, input_ids=ids[0].tolist(), top=top, positions=positions)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--smollm2", help="path of SmolLM2-135M-Instruct.Q4_1.gguf")
    args = parser.parse_args()
    cases = [losses(checkpoint) for checkpoint in CHECKPOINTS]
    for case in cases:
        print(case["checkpoint"], case["loss"], case["single_loss"])
    with open(os.path.join(FIXTURES, "decoders", "loss.json"), "w") as f:
        json.dump(dict(ignored_label=IGNORED, cases=cases), f, indent=1)
    if args.smollm2:
        with open(os.path.join(FIXTURES, "llama", "smollm2-perplexity.json"), "w") as f:
            json.dump(perplexity(args.smollm2), f, indent=1)
        with open(os.path.join(FIXTURES, "llama", "smollm2-prompt-logprobs.json"), "w") as f:
            json.dump(prompt_logprobs(args.smollm2), f, indent=1)


if __name__ == "__main__":
    main()
