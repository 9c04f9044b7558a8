"""A four-layer TransformerLens model, one head a layer, whose necessary components are known
by construction, and its prompts (in memory, no tokenizer: the Intervener and attribution read
token ids).

Task: "which word came right after the marker?" A prompt is BOS, then LENGTH distinct words
with the marker token at a random place (never last, never second to last); the answer is the
word after the marker, the distractor a word not in the prompt, which the corrupted prompt puts
in the answer's place. The marker's place differs from prompt to prompt and is the same in a
prompt and its corruption.

Residual dimensions: each token one-hot (TOKEN_DIMS), each position one-hot (POS_DIMS), four
flags F0..F3 and JUNK (a copy of the token dimensions that nothing reads). No norms anywhere,
so every path below is exact.

* L0H0 (SHARED head): a previous-token head (queries and keys read positions) whose value reads
  the marker's dimension: it writes F0 = 1 where the previous token is the marker.
* MLP0, MLP1, MLP2 (SHARED MLPs): a ReLU chain F0 -> F1 -> F2 -> F3 (a one-hot through a ReLU
  is itself).
* L3H0 (MOVER): a constant query, keys that read F3: the last position attends to the word
  after the marker and copies it into the token dimensions (OV), which the unembedding reads.
* L2H0 (DECOY): as loud as the mover, and moved by the corruption as it is (it attends by F2
  to the same word and copies it with the same OV), but into JUNK: it cannot change the metric.
* L1H0 and MLP3: all-zero weights.

Ground truth:
* What the behaviour needs (each of these ablated alone breaks it, under zero, mean and
  resample ablation alike; every other node ablated changes nothing): NECESSARY = the
  embedding, L0H0, MLP0, MLP1, MLP2 and L3H0. The SHARED nodes compute the same for a prompt
  and its corruption, but differ between prompts (the marker moves), so their mean or another
  prompt's value is wrong too.
* What carries the clean/corrupted difference: DIFFERENCE = the embedding (the answer token)
  and L3H0 (which moves it); patching any other node from the corruption changes nothing.
"""

from __future__ import annotations

import numpy as np

N_WORDS, LENGTH, N_CTX = 20, 8, 12
BOS, MARKER = 0, 1
WORD_IDS = list(range(2, 2 + N_WORDS))
D_VOCAB = 2 + N_WORDS
TOKEN_DIMS = list(range(D_VOCAB))
POS_DIMS = list(range(D_VOCAB, D_VOCAB + N_CTX))
F = [D_VOCAB + N_CTX + i for i in range(4)]  # F0..F3
JUNK = list(range(F[-1] + 1, F[-1] + 1 + D_VOCAB))
D_MODEL, D_HEAD, D_MLP = JUNK[-1] + 1, 24, 4
SHARP = 10.0  # query and key weights: attention logits SHARP**2 / sqrt(D_HEAD) ~ 20
OV = 4.0  # the mover's (and the decoy's) copy: the clean logit difference

EMBED = "embedding"
MOVER, DECOY, ZERO_HEAD = "head.3.0", "head.2.0", "head.1.0"
SHARED = ["head.0.0", "mlp.0", "mlp.1", "mlp.2"]
ZERO_MLP = "mlp.3"


def node_ids():
    """NECESSARY and DIFFERENCE as sets of circuitflow.nodes.Node ids."""
    from circuitflow.nodes import Node

    ids = {
        EMBED: Node("embedding").id,
        MOVER: Node("head", 3, 0).id,
        "head.0.0": Node("head", 0, 0).id,
        **{f"mlp.{i}": Node("mlp", i).id for i in range(3)},
    }
    necessary = {ids[k] for k in (EMBED, *SHARED, MOVER)}
    difference = {ids[EMBED], ids[MOVER]}
    return necessary, difference


def build():
    """The HookedTransformer, weights set as the module says, float32 on the CPU."""
    import torch
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=4, d_model=D_MODEL, d_head=D_HEAD, n_heads=1, d_mlp=D_MLP, n_ctx=N_CTX,
        d_vocab=D_VOCAB, act_fn="relu", normalization_type=None, seed=0,
    )  # fmt: skip
    model = HookedTransformer(cfg)
    b = model.blocks
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.W_E[TOKEN_DIMS, TOKEN_DIMS] = 1.0
        model.pos_embed.W_pos[range(N_CTX), POS_DIMS] = 1.0
        model.unembed.W_U[TOKEN_DIMS, TOKEN_DIMS] = 1.0
        # L0H0: position p attends to p - 1 and copies "is the marker" into F0.
        for p in range(N_CTX):
            b[0].attn.W_Q[0, POS_DIMS[p], p] = SHARP
            if p + 1 < N_CTX:
                b[0].attn.W_K[0, POS_DIMS[p], p + 1] = SHARP
        b[0].attn.W_V[0, MARKER, 0] = 1.0
        b[0].attn.W_O[0, 0, F[0]] = 1.0
        # MLP0..2: F0 -> F1 -> F2 -> F3.
        for i in range(3):
            b[i].mlp.W_in[F[i], 0] = 1.0
            b[i].mlp.W_out[0, F[i + 1]] = 1.0
        # L2H0 (decoy, keys F2, writes JUNK) and L3H0 (mover, keys F3, writes the tokens).
        for layer, key, out in ((2, F[2], JUNK), (3, F[3], TOKEN_DIMS)):
            attn = b[layer].attn
            attn.b_Q[0, 0] = SHARP
            attn.W_K[0, key, 0] = SHARP
            attn.W_V[0, TOKEN_DIMS, range(D_VOCAB)] = 1.0
            attn.W_O[0, range(D_VOCAB), out] = OV
    return model.eval()


def prompts(n: int = 48, seed: int = 0):
    """The prompt table (prompt_id, clean_tokens, corrupted_tokens, answer_id, distractor_id)
    of `n` prompts, the marker's place drawn uniformly."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        words = [WORD_IDS[j] for j in rng.choice(N_WORDS, LENGTH, replace=False)]
        answer, distractor = words[-2], words[-1]  # distinct; the distractor is not in it
        at = int(rng.integers(1, LENGTH - 1))  # the marker's place among the LENGTH tokens
        body = list(words[: LENGTH - 2])
        body.insert(at - 1, MARKER)
        body.insert(at, answer)
        clean = [BOS, *body]
        corrupted = [*clean]
        corrupted[at + 1] = distractor
        rows.append(
            {
                "prompt_id": i,
                "clean_tokens": np.array(clean, dtype=np.int64),
                "corrupted_tokens": np.array(corrupted, dtype=np.int64),
                "answer_id": answer,
                "distractor_id": distractor,
            }
        )
    return pd.DataFrame(rows)
