#!/usr/bin/env python
"""A cross-layer transcoder against the run's per-layer transcoders, on a finished run of the
embedded default (sae.kind both), at the same total features and the same L0.

The CLT (sae.cross_layer_train, TopK, k = sae.k a layer and sae.d_sae features a layer, as the
per-layer transcoders) is trained on the capture stage's activation files, every layer's MLP
input and output (`activations/mlp_in`, `mlp_out`), for as many tokens as the transcoders
(sae.total_tokens, batches of sae.batch_size, sae.lr). Both are then measured on the run's
held-out token set (`activations/held_out_tokens.npy`, which neither trained on), BOS left to
the real MLP as the transcoders were trained without it:

* `nmse`: per layer, |MLP out - reconstruction|^2 / |MLP out - its mean|^2 (float64 sums), the
  reconstruction from the real model's MLP inputs;
* `replaced_loss`, `kl`: every MLP replaced at once (each layer's dictionary reading the
  replaced model's own MLP input), the next-token cross-entropy and the KL divergence from the
  model's next-token distribution, per token; `model_loss` the model's own;
* per-prompt graphs (attribution.prompt_graphs.replacement.build, as the stage builds them, on
  the first `--prompts` prompts of each behaviour): circuit-tracer's replacement and
  completeness scores (prune.scores) and the active features a graph holds.

Usage (after `snakemake` on the embedded default):

    python benchmarks/clt_vs_transcoders.py --results results \\
        --out benchmarks/results/clt_vs_transcoders.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import yaml


def paired_rows(results: Path, n_layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every captured row's MLP inputs and outputs, [N, L, D] float32 (the files of one token
    set hold the same rows in the same order at every site and layer)."""
    from circuitflow.capture.files import open_activations

    def site(name: str) -> torch.Tensor:
        layers = []
        for layer in range(n_layers):
            with open_activations(results / "activations" / name / f"layer_{layer}.h5") as f:
                layers.append(torch.from_numpy(f["acts"][:].astype(np.float32)))
        return torch.stack(layers, 1)

    return site("mlp_in"), site("mlp_out")


def train_clt(x: torch.Tensor, y: torch.Tensor, sae: dict, d_sae: int, seed: int):
    from circuitflow.sae.cross_layer_train import CLTTrainConfig, shuffled_batches, train

    steps = int(sae["total_tokens"]) // int(sae["batch_size"])
    cfg = CLTTrainConfig(d_transcoder=d_sae, activation="topk", k=int(sae["k"]),
                         lr=float(sae["lr"]), steps=steps, seed=seed)  # fmt: skip
    epochs = -(-steps * int(sae["batch_size"]) // len(x))
    batches = (b for e in range(epochs)
               for b in shuffled_batches(x, y, int(sae["batch_size"]), seed + e))  # fmt: skip
    t0 = time.process_time()
    result = train(batches, cfg, feature_input_hook="ln2.hook_normalized",
                   model_name="circuitflow-embedded")  # fmt: skip
    return result, {"steps": steps, "cpu_s": round(time.process_time() - t0, 1)} | cfg.as_json()


class Replacement:
    """Every MLP's output from a dictionary: per-layer transcoders ({layer: SAELens
    transcoder}) or a CrossLayerTranscoder, BOS (position 0) left to the real MLP."""

    def __init__(self, dictionary, n_layers: int):
        from circuitflow.attribution.prompt_graphs.replacement import is_cross_layer

        self.d, self.n_layers, self.clt = dictionary, n_layers, is_cross_layer(dictionary)

    def outputs(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each layer's MLP output from the MLP inputs [B, T, D] of layers 0..len-1."""
        if self.clt:
            x = torch.stack(inputs, 2)  # [B, T, L', D]
            b, t, n, d = x.shape
            feats = [self.d.encode(i, x[:, :, i].reshape(-1, d)) for i in range(n)]
            out = []
            for target in range(n):
                r = self.d.b_dec[target].float().expand(b * t, d).clone()
                for source in range(target + 1):
                    r += feats[source].float() @ self.d.W_dec[source][:, target - source].float()
                out.append(r.reshape(b, t, d))
            return out
        return [self.d[i].decode(self.d[i].encode(x)).float() for i, x in enumerate(inputs)]

    def hooks(self, model) -> list:
        """Forward hooks that replace each MLP's output, reading the replaced model's inputs."""
        inputs: list[torch.Tensor] = []

        def read(act, hook):
            inputs.append(act)

        def write(act, hook, layer: int):
            out = self.outputs(inputs[: layer + 1])[layer].to(act.dtype)
            return torch.cat([act[:, :1], out[:, 1:]], 1)

        hooks = []
        for layer in range(self.n_layers):
            hooks.append((f"blocks.{layer}.ln2.hook_normalized", read))
            hooks.append((f"blocks.{layer}.hook_mlp_out",
                          lambda a, hook, layer=layer: write(a, hook, layer)))  # fmt: skip
        return hooks


@torch.no_grad()
def held_out_metrics(model, dictionary, tokens: torch.Tensor, batch: int = 64) -> dict:
    n_layers = model.cfg.n_layers
    rep = Replacement(dictionary, n_layers)
    sq = np.zeros(n_layers)
    var = np.zeros(n_layers)
    ce_model = ce_rep = kl = 0.0
    n_tok = 0
    names = [f"blocks.{i}.ln2.hook_normalized" for i in range(n_layers)]
    names += [f"blocks.{i}.hook_mlp_out" for i in range(n_layers)]
    for start in range(0, len(tokens), batch):
        toks = tokens[start : start + batch]
        logits, cache = model.run_with_cache(toks, names_filter=lambda n: n in names)
        ins = [cache[f"blocks.{i}.ln2.hook_normalized"].float() for i in range(n_layers)]
        outs = rep.outputs(ins)
        for i in range(n_layers):
            real = cache[f"blocks.{i}.hook_mlp_out"].float()[:, 1:].double()
            sq[i] += float(((real - outs[i][:, 1:].double()) ** 2).sum())
            var[i] += float(((real - real.mean((0, 1))) ** 2).sum())
        with model.hooks(fwd_hooks=rep.hooks(model)):
            replaced = model(toks)
        logp = logits[:, :-1].float().log_softmax(-1).double()
        logq = replaced[:, :-1].float().log_softmax(-1).double()
        target = toks[:, 1:, None]
        ce_model -= float(logp.gather(-1, target).sum())
        ce_rep -= float(logq.gather(-1, target).sum())
        kl += float((logp.exp() * (logp - logq)).sum())
        n_tok += target.numel()
    return {
        "nmse": [round(float(s / v), 5) for s, v in zip(sq, var, strict=True)],
        "model_loss": round(ce_model / n_tok, 5),
        "replaced_loss": round(ce_rep / n_tok, 5),
        "kl": round(kl / n_tok, 5),
    }


def graph_scores(model, dictionary, prompts, skip_bos: bool, cfg) -> dict:
    from circuitflow.attribution.prompt_graphs import prune, replacement

    rows = []
    for row in prompts.itertuples():
        graph = replacement.build(
            model, dictionary, [int(t) for t in row.clean_tokens], int(row.answer_id),
            int(row.distractor_id), skip_bos=skip_bos, max_feature_nodes=cfg.max_feature_nodes,
            batch_size=cfg.prompt_graph_batch_size,
        )  # fmt: skip
        s = prune.scores(graph.adjacency, graph.kinds())
        rows.append({"replacement": s["replacement_score"],
                     "completeness": s["completeness_score"],
                     "features": graph.n_features + graph.dropped_features})  # fmt: skip
    return {k: round(float(np.mean([r[k] for r in rows])), 4) for k in rows[0]} | {
        "prompts": len(rows)
    }


def main() -> None:
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.attribution.prompt_graphs.stage import load_transcoders
    from circuitflow.model.load import load_model
    from circuitflow.prompts import read_prompts

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--prompts", type=int, default=8, help="graphs a behaviour")
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    a = parser.parse_args()
    torch.manual_seed(0)
    config = yaml.safe_load((a.results / "provenance" / "config.resolved.yaml").read_text())
    model = load_model(a.results / "model", "cpu", "float32")
    for p in model.parameters():
        p.requires_grad_(False)
    dirs = sorted((a.results / "saes" / "mlp_out").glob("layer_*"))
    transcoders = load_transcoders(dirs, "cpu")
    d_sae = int(transcoders[0].cfg.d_sae)
    x, y = paired_rows(a.results, model.cfg.n_layers)
    result, trained = train_clt(x, y, config["sae"], d_sae, int(config["seed"]))
    clt = result.clt
    held = torch.from_numpy(np.load(a.results / "activations" / "held_out_tokens.npy")).long()
    acfg = AttributionConfig.from_dict(config["attribution"])
    skip_bos = bool(config["capture"]["exclude_bos"])
    out = {
        "command": "python benchmarks/clt_vs_transcoders.py",
        "features_a_layer": d_sae, "k_a_layer": int(config["sae"]["k"]),
        "clt_training": trained | {"final_loss": round(result.losses[-1], 5)},
        "held_out_tokens": int(held.numel()),
    }  # fmt: skip
    for name, dictionary in (("transcoders", transcoders), ("clt", clt)):
        entry = held_out_metrics(model, dictionary, held)
        for behaviour in config["behaviours"]:
            prompts = read_prompts(a.results / "prompts" / f"{behaviour}.parquet").head(a.prompts)
            entry[f"graphs_{behaviour}"] = graph_scores(model, dictionary, prompts, skip_bos, acfg)
        out[name] = entry
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
