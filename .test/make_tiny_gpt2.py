#!/usr/bin/env python
"""Make .test/tiny-gpt2/ (a GPT-2-architecture Hugging Face model: 2 layers, d_model 32, random
weights, a byte-level BPE tokenizer trained here on names, places and capitals) and
.test/corpus.txt, the local model and corpus of .test/config/real-model.yaml. No download.

    python .test/make_tiny_gpt2.py        # rewrites both (they are committed)
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    from circuitflow.prompts import CAPITALS, IOI_NAMES, IOI_OBJECTS, IOI_PLACES, IOI_TEMPLATES

    sentences = [t.replace("{A}", "Mary").replace("{B}", "John") for t in IOI_TEMPLATES]
    sentences += [f"The capital of {c} is the city of {k}" for c, k in CAPITALS.items()]
    training = sentences + [" ".join(IOI_NAMES), " ".join(IOI_PLACES), " ".join(IOI_OBJECTS)]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        training * 20, vocab_size=600, min_frequency=1, special_tokens=["<|endoftext|>"]
    )
    eos = "<|endoftext|>"
    tokenizer = GPT2TokenizerFast(tokenizer_object=bpe, bos_token=eos, eos_token=eos, unk_token=eos)
    # n_ctx as in the real gpt2 config.json (TransformerLens reads it).
    eos_id = tokenizer.eos_token_id
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_ctx=64, n_embd=32, n_layer=2,
                        n_head=2, bos_token_id=eos_id, eos_token_id=eos_id)  # fmt: skip
    torch.manual_seed(0)
    out = HERE / "tiny-gpt2"
    GPT2LMHeadModel(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (HERE / "corpus.txt").write_text("\n".join(sentences * 40) + "\n")
    print(f"wrote {out} and {HERE / 'corpus.txt'}")


if __name__ == "__main__":
    main()
