#!/usr/bin/env python
"""circuitflow's per-prompt graphs side by side with circuit-tracer 0.5.0's, on the same model,
transcoders and prompts: a tiny Qwen3 (random weights) and both published layouts
(circuit-tracer's own Qwen3 transcoders, mwhanna_transcoder: ReLU; Gemma Scope 2's, gemma_3:
JumpReLU with a skip path), built by tests/helpers/published_transcoders.py. No download.

circuit-tracer 0.5.0 needs transformers <= 4.57.3 (ours runs 5.x), so it runs in a throwaway
environment of its own, in three steps sharing one folder:

    python benchmarks/circuit_tracer_side_by_side.py ours --work W          # this venv
    python3 -m venv /tmp/ct && /tmp/ct/bin/pip install 'torch==2.13.0' \\
        circuit-tracer==0.5.0 'transformers==4.57.3'                         # once
        (torch first, a CPU build: a local torch-2.13.0+cpu wheel where PyPI's would be CUDA's;
        circuit-tracer then brings nnsight and transformer-lens of its own)
    /tmp/ct/bin/python benchmarks/circuit_tracer_side_by_side.py circuit-tracer --work W
    python benchmarks/circuit_tracer_side_by_side.py compare --work W [--out results.json]

`ours` builds the model and the release copies, writes the model's TransformerLens state (as
circuitflow loads it) and each graph (circuitflow.attribution.prompt_graphs: the transcoders
loaded and adapted as the pretrained_sae stage does); `circuit-tracer` loads that state into
its TransformerLensReplacementModel, the release files through its own loaders
(load_relu_transcoder, load_gemma_scope_2_transcoder; hooks mlp.hook_in -> mlp.hook_out) and
attributes the same prompts to the same logit difference (a custom target, weight 1);
`compare` prints, per graph, the features and activations, the edges (median and largest
relative difference over edges above a thousandth of the largest; largest absolute difference
over the largest edge), the BOS error nodes' share of |A| (circuit-tracer zeroes them: the one
difference, compared out), and, with circuitflow's BOS error nodes zeroed as circuit-tracer's,
whether pruning keeps the same nodes and links and the score differences.

Cross-layer transcoders (CLT_CASES): a random CLT of the same model in circuit-tracer's layout
(sae.cross_layer.save_clt: W_enc_{i}, W_dec_{i} [F, L - i, D], ...), ReLU and JumpReLU, read by
its load_clt (hooks mlp.hook_in -> mlp.hook_out) and by ours (load_clt, the ln2 weight folded
into the encoders as for per-layer transcoders), the same prompts. `compare` adds, per CLT graph,
edges within EDGE_TOLERANCE of circuit-tracer's relative to the graph's largest edge (BOS error
nodes compared out, as above), and for `clt-diagonal` (the ReLU CLT with its decoders into later
layers zero, beside the per-layer transcoders holding the same weights, layout mwhanna-diagonal)
whether our two graphs are equal bit for bit (the graph code is one: they are wherever the two
encoders' matrix products give the same activations; tests/attribution/
test_prompt_graphs_clt.py holds the encoder in the per-layer layout and asserts it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
N_LAYERS, D_MODEL = 2, 32
ANSWER, DISTRACTOR = 17, 23  # the logit difference every graph is drawn for
LENGTHS = (9, 12, 15)  # each prompt: BOS, then this many random tokens
LAYOUTS = {  # layout -> (the copy's folder, the file or folder of layer L in it)
    "mwhanna_transcoder": ("mwhanna", "layer_{layer}.safetensors"),
    "gemma_3": ("gemma", "transcoder_all/layer_{layer}_width_48_l0_small_affine"),
}
THRESHOLDS = (0.8, 0.98)  # node and edge: circuit-tracer's defaults
CLT_CASES = {"clt-relu": "relu", "clt-jumprelu": "jumprelu"}  # folder -> activation
CLT_WIDTH = 40  # features a layer
EDGE_TOLERANCE = 1e-5  # |ours - circuit-tracer's| / the graph's largest |edge|


def random_clt(activation: str, seed: int, diagonal: bool = False):
    """A CLT of the tiny model (N_LAYERS, D_MODEL) with random weights, a tenth or so of its
    features firing a token; `diagonal`: its decoders into later layers zero."""
    import torch

    from circuitflow.sae.cross_layer import CrossLayerTranscoder

    clt = CrossLayerTranscoder(N_LAYERS, D_MODEL, CLT_WIDTH, activation=activation,
                               feature_input_hook="mlp.hook_in",
                               feature_output_hook="mlp.hook_out")  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        clt.W_enc.copy_(torch.randn(clt.W_enc.shape, generator=g) / D_MODEL**0.5)
        clt.b_enc.copy_(torch.randn(clt.b_enc.shape, generator=g) * 0.1 - 1.5)
        clt.b_dec.copy_(torch.randn(clt.b_dec.shape, generator=g) * 0.1)
        for w in clt.W_dec:
            w.copy_(torch.randn(w.shape, generator=g) * 0.2)
            if diagonal:
                w[:, 1:] = 0.0
        if clt.threshold is not None:
            clt.threshold.copy_(torch.rand(clt.threshold.shape, generator=g) * 0.1)
    return clt


def ours(work: Path) -> None:
    """The model, the release copies, the model's state, and circuitflow's graphs."""
    sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]
    import numpy as np
    import torch
    from helpers.published_transcoders import (
        D_SAE,
        lay_out_gemma_scope_2,
        lay_out_mwhanna,
        make_tiny_qwen3,
        transcoder_weights,
    )
    from safetensors.torch import save_file

    from circuitflow.attribution.prompt_graphs import prune, replacement
    from circuitflow.model.load import load_local_hf
    from circuitflow.published import Dictionary
    from circuitflow.sae.cross_layer import load_clt, save_clt
    from circuitflow.sae.cross_layer_files import ModelShape, check_against, open_clt
    from circuitflow.sae.pretrained import adapt_transcoder, load

    work.mkdir(parents=True, exist_ok=True)
    model_dir = make_tiny_qwen3(work)
    lay_out_mwhanna(
        work / "mwhanna",
        model_dir,
        {n: transcoder_weights(D_MODEL, D_SAE, n, skip=False) for n in range(N_LAYERS)},
    )
    lay_out_gemma_scope_2(work / "gemma", model_dir,
                          {n: transcoder_weights(D_MODEL, D_SAE, 10 + n, skip=True)
                           for n in range(N_LAYERS)})  # fmt: skip
    model = load_local_hf(model_dir, "cpu", torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              work / "tl_state.safetensors")  # fmt: skip
    scalar = (int, float, str, bool, list, type(None))
    cfg = {k: v for k, v in model.cfg.to_dict().items() if isinstance(v, scalar)}
    (work / "tl_cfg.json").write_text(json.dumps(cfg, default=str))
    g = torch.Generator().manual_seed(7)
    prompts = [[0, *torch.randint(1, 600, (n,), generator=g).tolist()] for n in LENGTHS]
    graphs = {}
    for layout, (folder, member) in LAYOUTS.items():
        transcoders = {}
        for layer in range(N_LAYERS):
            d = Dictionary("mlp_out", layer, sae_id=member.format(layer=layer),
                           path=str(work / folder), format=layout)  # fmt: skip
            loaded = load(d, None, "cpu")
            adapt_transcoder(loaded.sae, loaded.view, layer, model)
            transcoders[layer] = loaded.sae
        for i, tokens in enumerate(prompts):
            graph = replacement.build(model, transcoders, tokens, ANSWER, DISTRACTOR,
                                      skip_bos=True, max_feature_nodes=100_000,
                                      batch_size=64)  # fmt: skip
            np.savez(work / f"ours-{layout}-{i}.npz", adjacency=graph.adjacency.numpy(),
                     features=graph.features.numpy(),
                     activations=graph.activations.numpy())  # fmt: skip
            graphs[f"{layout}-{i}"] = prune.scores(graph.adjacency, graph.kinds())
    # CLTs in circuit-tracer's layout, and the diagonal one beside per-layer transcoders.
    for seed, (folder, activation) in enumerate(CLT_CASES.items()):
        save_clt(random_clt(activation, 20 + seed), work / folder)
    diagonal = random_clt("relu", 30, diagonal=True)
    save_clt(diagonal, work / "clt-diagonal")
    lay_out_mwhanna(work / "mwhanna-diagonal", model_dir, {
        i: {"W_enc": diagonal.W_enc[i].T, "W_dec": diagonal.W_dec[i][:, 0].contiguous(),
            "b_enc": diagonal.b_enc[i], "b_dec": diagonal.b_dec[i]} for i in range(N_LAYERS)
    })  # fmt: skip
    shape = ModelShape.of(model)
    for folder in (*CLT_CASES, "clt-diagonal"):
        clt = load_clt(work / folder, shape)
        if check_against(open_clt(work / folder, shape), shape):  # read after ln2's weight
            for i in range(N_LAYERS):
                ln2 = model.blocks[i].ln2
                clt.fold_input_norm(i, ln2.w, getattr(ln2, "b", None))
        for i, tokens in enumerate(prompts):
            graph = replacement.build(model, clt, tokens, ANSWER, DISTRACTOR, skip_bos=True,
                                      max_feature_nodes=100_000, batch_size=64)  # fmt: skip
            np.savez(work / f"ours-{folder}-{i}.npz", adjacency=graph.adjacency.numpy(),
                     features=graph.features.numpy(),
                     activations=graph.activations.numpy())  # fmt: skip
            graphs[f"{folder}-{i}"] = prune.scores(graph.adjacency, graph.kinds())
    transcoders = {}
    for layer in range(N_LAYERS):
        d = Dictionary("mlp_out", layer, sae_id=f"layer_{layer}.safetensors",
                       path=str(work / "mwhanna-diagonal"),
                       format="mwhanna_transcoder")  # fmt: skip
        loaded = load(d, None, "cpu")
        adapt_transcoder(loaded.sae, loaded.view, layer, model)
        transcoders[layer] = loaded.sae
    for i, tokens in enumerate(prompts):
        graph = replacement.build(model, transcoders, tokens, ANSWER, DISTRACTOR, skip_bos=True,
                                  max_feature_nodes=100_000, batch_size=64)  # fmt: skip
        np.savez(work / f"ours-mwhanna-diagonal-{i}.npz", adjacency=graph.adjacency.numpy(),
                 features=graph.features.numpy(),
                 activations=graph.activations.numpy())  # fmt: skip
    spec = {"prompts": prompts, "answer": ANSWER, "distractor": DISTRACTOR, "graphs": graphs}
    (work / "ours.json").write_text(json.dumps(spec))


def circuit_tracer(work: Path) -> None:
    """circuit-tracer 0.5.0's graphs of the same prompts (run in its own environment)."""
    import inspect

    import numpy as np
    import torch
    from circuit_tracer.attribution.attribute import attribute
    from circuit_tracer.attribution.targets import CustomTarget
    from circuit_tracer.graph import compute_graph_scores, prune_graph
    from circuit_tracer.replacement_model.replacement_model_transformerlens import (
        TransformerLensReplacementModel,
    )
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt
    from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set
    from safetensors.torch import load_file
    from transformer_lens import HookedTransformerConfig
    from transformers import AutoTokenizer

    spec = json.loads((work / "ours.json").read_text())
    fields = set(inspect.signature(HookedTransformerConfig).parameters)
    raw = json.loads((work / "tl_cfg.json").read_text())
    cfg = HookedTransformerConfig(**{k: v for k, v in raw.items()
                                     if k in fields and k not in ("dtype", "device", "n_params")},
                                  dtype=torch.float32, device="cpu")  # fmt: skip
    buffers = (".mask", "IGNORE", "rotary_sin", "rotary_cos")  # rebuilt from the config
    state = {k: v for k, v in load_file(work / "tl_state.safetensors").items()
             if not k.endswith(buffers)}  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(work / "google" / "tiny-qwen3")
    scores = {}

    def replacements():
        """(layout, circuit-tracer's transcoders): the per-layer sets, then the CLTs."""
        for layout, (folder, member) in LAYOUTS.items():
            files = {n: str(work / folder / member.format(layer=n)) for n in range(N_LAYERS)}
            if layout == "gemma_3":
                files = {n: f"{path}/params.safetensors" for n, path in files.items()}
            yield layout, load_transcoder_set(
                files, scan="side-by-side", feature_input_hook="mlp.hook_in",
                feature_output_hook="mlp.hook_out", device=torch.device("cpu"),
                special_load_fn="gemma-scope-2" if layout == "gemma_3" else None,
                lazy_encoder=False, lazy_decoder=False,
            )  # fmt: skip
        for folder in (*CLT_CASES, "clt-diagonal"):
            yield folder, load_clt(str(work / folder), feature_input_hook="mlp.hook_in",
                                   feature_output_hook="mlp.hook_out", scan="side-by-side",
                                   device=torch.device("cpu"), dtype=torch.float32,
                                   lazy_decoder=False)  # fmt: skip

    for layout, transcoders in replacements():
        model = TransformerLensReplacementModel(cfg, tokenizer=tokenizer, move_to_device=False)
        model.load_state_dict(state, strict=False)
        model._configure_replacement_model(transcoders)
        w_u = model.unembed.W_U.detach()
        target = CustomTarget(
            "logit diff", 1.0, w_u[:, spec["answer"]] - w_u[:, spec["distractor"]]
        )
        for i, tokens in enumerate(spec["prompts"]):
            graph = attribute(torch.tensor(tokens), model, attribution_targets=[target],
                              max_feature_nodes=None, batch_size=64)  # fmt: skip
            nodes, links, _ = prune_graph(graph, *THRESHOLDS)
            replacement_score, completeness_score = compute_graph_scores(graph)
            selected = graph.selected_features
            np.savez(work / f"ct-{layout}-{i}.npz", adjacency=graph.adjacency_matrix.numpy(),
                     features=graph.active_features[selected].numpy(),
                     activations=graph.activation_values[selected].numpy(),
                     node_mask=nodes.numpy(), edge_mask=links.numpy())  # fmt: skip
            scores[f"{layout}-{i}"] = {"replacement_score": float(replacement_score),
                                       "completeness_score": float(completeness_score)}  # fmt: skip
    (work / "ct.json").write_text(json.dumps(scores))


def compare(work: Path, out: Path | None) -> list[dict]:
    """The two sides' graphs compared (see the module's doc); printed, and written to `out`."""
    sys.path.insert(0, str(REPO / "src"))
    import numpy as np
    import torch

    from circuitflow.attribution.prompt_graphs import prune

    ours_spec = json.loads((work / "ours.json").read_text())
    theirs = json.loads((work / "ct.json").read_text())
    rows = []
    for key, mine in ours_spec["graphs"].items():
        o, c = np.load(work / f"ours-{key}.npz"), np.load(work / f"ct-{key}.npz")
        n_f = len(o["features"])
        n_pos = (len(o["adjacency"]) - n_f - 1) // (N_LAYERS + 1)
        bos_errors = [n_f + layer * n_pos for layer in range(N_LAYERS)]
        a, b = o["adjacency"].astype(np.float64), c["adjacency"].astype(np.float64)
        rest = np.ones_like(a, dtype=bool)
        rest[:, bos_errors] = False
        large = rest & (np.abs(b) > 1e-3 * np.abs(b).max())
        relative = np.abs(a - b)[large] / np.abs(b)[large]
        zeroed = torch.tensor(a, dtype=torch.float32)
        zeroed[:, bos_errors] = 0  # circuit-tracer's first-position rule
        kinds = ["feature"] * n_f + ["error"] * (N_LAYERS * n_pos) + ["token"] * n_pos + ["logit"]
        pruned = prune.prune(zeroed, kinds, *THRESHOLDS)
        scores = prune.scores(zeroed, kinds)
        edge_over_max = float(np.abs(a - b)[rest].max() / np.abs(b).max())
        extra = {}
        if key.startswith("clt-"):
            extra["edges_within_tolerance"] = edge_over_max <= EDGE_TOLERANCE
        if key.startswith("clt-diagonal"):
            p = np.load(work / f"ours-mwhanna-diagonal-{key.rsplit('-', 1)[1]}.npz")
            extra["equals_per_layer_graph"] = all(
                bool(np.array_equal(o[k], p[k])) for k in ("adjacency", "features", "activations")
            )
            # The encoders multiply in another memory layout (W_enc [F, D] against SAELens's
            # [D, F]): an activation may differ in its last bit, and its edges with it.
            extra["per_layer_same_activations"] = bool(
                np.array_equal(o["activations"], p["activations"])
            )
            extra["per_layer_max_abs_diff_over_max"] = float(
                np.abs(o["adjacency"] - p["adjacency"]).max() / np.abs(p["adjacency"]).max()
            )
        rows.append({
            "graph": key,
            "features": n_f,
            "same_features": bool((o["features"] == c["features"]).all()),
            "activation_max_abs_diff": float(np.abs(o["activations"] - c["activations"]).max()),
            "edge_median_rel_diff": float(np.median(relative)),
            "edge_max_rel_diff": float(relative.max()),
            "edge_max_abs_diff_over_max": edge_over_max,
            "bos_error_share": float(np.abs(a[:, bos_errors]).sum() / np.abs(a).sum()),
            "same_pruned_nodes": bool((pruned.node_mask.numpy() == c["node_mask"]).all()),
            "same_pruned_links": bool((pruned.edge_mask.numpy() == c["edge_mask"]).all()),
            "replacement_score": [mine["replacement_score"], theirs[key]["replacement_score"]],
            "replacement_diff_bos_zeroed": scores["replacement_score"]
            - theirs[key]["replacement_score"],
            "completeness_diff_bos_zeroed": scores["completeness_score"]
            - theirs[key]["completeness_score"],
            **extra,
        })  # fmt: skip
    for row in rows:
        print(json.dumps(row))
    if out is not None:
        out.write_text(json.dumps({"circuit_tracer": "0.5.0", "graphs": rows}, indent=1) + "\n")
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["ours", "circuit-tracer", "compare"])
    parser.add_argument("--work", type=Path, required=True, help="the folder the steps share")
    parser.add_argument("--out", type=Path, help="compare: write the rows here (JSON)")
    args = parser.parse_args(argv)
    {"ours": ours, "circuit-tracer": circuit_tracer}.get(args.step, lambda w: None)(args.work)
    if args.step == "compare":
        compare(args.work, args.out)


if __name__ == "__main__":
    main()
