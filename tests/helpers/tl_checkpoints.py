"""Small TransformerLens checkpoint directories (model.json kind `tl_checkpoint`) of three
shapes, each with a mechanism planted by hand, saved as README's "Your own model" says.

Words `w0 .. w19` and `<bos>`, `<unk>` make a word-level tokenizer. The residual stream holds
each token one-hot (dimensions 0-21) and each position one-hot (22-33); the unembedding reads
the token dimensions back. In the last layer, head PLANTED is a previous-token head: its
queries and keys read positions only, so every position attends to the one before, and its
values copy that token into the residual stream. Head DECOY is as loud, but attends to its
own position, so it copies the last token, the same in a clean prompt and its corrupted twin;
every other head, and the MLPs, carry small random weights. "Which word came before the last
one?" (`prompts`) is then the planted head's alone: attribution must rank it first.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

WORDS = [f"w{i}" for i in range(20)]
SPECIALS = ["<bos>", "<unk>"]
VOCAB = [*SPECIALS, *WORDS]
N_CTX, D_MODEL, D_HEAD, N_HEADS, D_MLP = 12, 48, 24, 3, 32
TOKEN_DIMS, POS_DIMS = range(len(VOCAB)), range(len(VOCAB), len(VOCAB) + N_CTX)
DECOY, PLANTED = 0, 1
QK, OV, NOISE = 8.0, 4.0, 0.05
# The three shapes: TransformerLens config fields on top of the common ones.
SHAPES = {
    "ln": {"n_layers": 1, "normalization_type": "LN"},
    "no_ln": {"n_layers": 1, "normalization_type": None},
    "attn_only": {"n_layers": 2, "normalization_type": "LN", "attn_only": True},
    "silent_mlp": {"n_layers": 2, "normalization_type": "LN"},
}
# Shape -> the layer whose MLP writes nothing (all its weights and biases zero): compiled,
# pruned and hand-built models have such layers, and every stage must take them as data.
SILENT_MLP = {"silent_mlp": 0}


def tokenizer():
    """A word-level Hugging Face tokenizer of VOCAB (whitespace split)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<bos>", pad_token="<bos>",
        unk_token="<unk>",
    )  # fmt: skip


def build(shape: str, seed: int = 0):
    """The HookedTransformer of `shape` (a key of SHAPES), its weights set as the module says
    (SILENT_MLP's MLP zero), in float32 on the CPU, with its tokenizer."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        d_model=D_MODEL, d_head=D_HEAD, n_heads=N_HEADS, d_mlp=D_MLP, n_ctx=N_CTX,
        d_vocab=len(VOCAB), act_fn="relu", seed=seed, **SHAPES[shape],
    )  # fmt: skip
    # A tokenizer saved first: TransformerLens reloads it from its folder (add_bos_token).
    model = _with_weights(HookedTransformer(cfg, tokenizer=_saved_tokenizer()), seed, torch)
    if shape in SILENT_MLP:
        with torch.no_grad():
            for p in model.blocks[SILENT_MLP[shape]].mlp.parameters():
                p.zero_()
    return model


def _saved_tokenizer():
    import tempfile

    from transformers import AutoTokenizer

    folder = Path(tempfile.mkdtemp(prefix="tl-tokenizer-"))
    tokenizer().save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def _with_weights(model, seed: int, torch):
    gen = torch.Generator().manual_seed(seed)

    def noise(*shape):
        return NOISE * torch.randn(*shape, generator=gen)

    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for name, p in model.named_parameters():
            if name.endswith(".w"):  # LayerNorm scales
                p.fill_(1.0)
        tokens, positions = list(TOKEN_DIMS), list(POS_DIMS)
        model.embed.W_E[tokens, tokens] = 1.0
        model.pos_embed.W_pos[range(N_CTX), positions] = 1.0
        model.unembed.W_U[tokens, tokens] = 1.0
        last = model.cfg.n_layers - 1
        for layer, block in enumerate(model.blocks):
            attn = block.attn
            for name in ("W_Q", "W_K", "W_V", "W_O"):
                getattr(attn, name).copy_(noise(*getattr(attn, name).shape))
            if layer == last:
                for head, offset in ((DECOY, 0), (PLANTED, 1)):
                    for w in ("W_Q", "W_K", "W_V", "W_O"):
                        getattr(attn, w)[head].zero_()
                    for pos in range(N_CTX):
                        attn.W_Q[head, positions[pos], pos] = QK
                    # Key position k answers query k + offset (the planted head: the one before).
                    for pos in range(N_CTX - offset):
                        attn.W_K[head, positions[pos], pos + offset] = QK
                    attn.W_V[head, tokens, tokens] = 1.0
                    attn.W_O[head, tokens, tokens] = OV
            if not model.cfg.attn_only:
                block.mlp.W_in.copy_(noise(*block.mlp.W_in.shape) * 10)
                block.mlp.W_out.copy_(noise(*block.mlp.W_out.shape))
    return model.eval()


def save(model, out_dir: Path | str, buffers: bool = True) -> Path:
    """README's recipe (tokenizer, config, weights); without `buffers` the state dict leaves
    TransformerLens's attention buffers out, as a hand-written one may."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    model.tokenizer.save_pretrained(out_dir / "tokenizer")
    json.dump(model.cfg.to_dict(), open(out_dir / "tl_config.json", "w"), default=str)
    state = model.state_dict()
    if not buffers:
        kept = {name for name, _ in model.named_parameters()}
        state = {k: v for k, v in state.items() if k in kept}
    save_file(state, out_dir / "weights.safetensors")
    return out_dir


def prompts_csv(path: Path | str, n: int, seed: int = 0) -> Path:
    """`n` rows of "which word came before the last?": 4 to 8 distinct words; the answer is
    the one before the last, the distractor a word not in the prompt, which the corrupted
    prompt puts in the answer's place."""
    rng = np.random.default_rng(seed)
    lines = ["prompt,answer,distractor,corrupted_prompt"]
    for _ in range(n):
        length = int(rng.integers(4, 9))
        words = [WORDS[i] for i in rng.choice(len(WORDS), length + 1, replace=False)]
        prompt, distractor = words[:length], words[length]
        corrupted = [*prompt[:-2], distractor, prompt[-1]]
        lines.append(f"{' '.join(prompt)},{prompt[-2]},{distractor},{' '.join(corrupted)}")
    Path(path).write_text("\n".join(lines) + "\n")
    return Path(path)


def corpus(path: Path | str, n_lines: int = 1500, seed: int = 1) -> Path:
    """A text corpus of random word sequences, one document a line."""
    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, int(rng.integers(6, 16)))) for _ in range(n_lines)]
    Path(path).write_text("\n".join(lines) + "\n")
    return Path(path)


# The example config/your-own-model.yaml runs (.test/make_tl_toy.py writes it).
EXAMPLE = {"model": "tl-toy", "prompts": "tl-toy-previous.csv", "corpus": "tl-toy-corpus.txt"}
EXAMPLE_SHAPE, EXAMPLE_PROMPTS = "no_ln", 32


def write_example(folder: Path | str) -> None:
    """The example's checkpoint (saved as README's recipe does), prompts and corpus."""
    folder = Path(folder)
    save(build(EXAMPLE_SHAPE), folder / EXAMPLE["model"])
    prompts_csv(folder / EXAMPLE["prompts"], EXAMPLE_PROMPTS)
    corpus(folder / EXAMPLE["corpus"])
