"""A per-prompt graph at GPT-2-small scale: its counted cost and its memory against the plan
(issue 30, item 7).

    python benchmarks/prompt_graphs.py --json benchmarks/results/prompt_graphs-cpu.json   # CPU
    python benchmarks/prompt_graphs.py --device cuda --max-feature-nodes 4096 \
        --json benchmarks/results/prompt_graphs-cuda.json                        # a GPU node

GPT-2 small's architecture with random weights (architectures.config("gpt2-small"), no
download) and a random TopK transcoder per layer (`--expansion` x 768 latents, k = `--k`), on a
random prompt of `--positions` tokens: every position's k features active in every layer, so the
`--max-feature-nodes` cap binds. The stage's own code builds the graph (attribution.prompt_graphs:
replacement.build, prune, heads.split_edges, validate.validate), as the prompt_graphs job runs it.

Reported:
- `forward_equivalents` by part (perf.PassCounter), against the plan's bound
  (plan.graph_passes: the clean and bias passes, a forward and a backward per row and per head
  split row, the validation's ablations), with the stage's defaults (8 heads for each of at
  most 32 targets, 10 validation features);
- `seconds` by step, and per graph row;
- memory of the work: CPU: the resident-set high-water mark over the graph's steps minus the
  resident set before them (memory.PeakMeter; the model and transcoders are loaded before);
  CUDA: the allocator's peak minus what was allocated before; against the plan's parts that
  are not the weights (plan.graph_bytes: `fixed`, `rows`, `store`, `adjacency`), as
  `plan_over_measured`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402
from sae_train import device_info  # noqa: E402  (benchmarks/ is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from circuitflow.attribution.prompt_graphs import heads, plan, prune, replacement, validate  # noqa: E402
from circuitflow.attribution.prompt_graphs.stage import linearity_error  # noqa: E402
from circuitflow.memory.probes import PeakMeter, track_live_bytes_on_cpu  # noqa: E402
from circuitflow.model import architectures  # noqa: E402
from circuitflow.nodes import hook_name, mlp_hook  # noqa: E402


def transcoders(model, d_sae: int, k: int, seed: int = 0) -> dict:
    from sae_lens.saes.sae import SAEMetadata

    from circuitflow.sae.transcoder import TopKTranscoder, TopKTranscoderConfig

    g = torch.Generator().manual_seed(seed)
    d = model.cfg.d_model
    out = {}
    for layer in range(model.cfg.n_layers):
        meta = SAEMetadata(hook_name=hook_name("mlp_in", layer), hook_name_out=mlp_hook(layer))
        tc = TopKTranscoder(TopKTranscoderConfig(d_in=d, d_sae=d_sae, d_out=d, k=k, metadata=meta,
                                                 apply_b_dec_to_input=False))  # fmt: skip
        with torch.no_grad():
            for p in tc.parameters():
                p.copy_(torch.randn(p.shape, generator=g) / d**0.5)
                p.requires_grad_(False)
        out[layer] = tc.to(model.cfg.device).eval()
    return out


def pipeline_config(args) -> dict:
    """The config the plan reads: config/gpt2-small.yaml with transcoders and these settings."""
    import yaml

    from circuitflow import config as cf_config

    config = yaml.safe_load((ROOT / "config" / "gpt2-small.yaml").read_text())
    config["sites"] = ["mlp_out"]
    config["sae"] = {**config.get("sae", {}), "kind": "transcoder", "architecture": "topk",
                     "expansion_factor": args.expansion, "k": args.k, "d_sae": None}  # fmt: skip
    config["attribution"] = {**config.get("attribution", {}),
                             "max_feature_nodes": args.max_feature_nodes,
                             "prompt_graph_batch_size": args.batch}  # fmt: skip
    return cf_config.resolve(config)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--positions", type=int, default=32)
    p.add_argument("--expansion", type=int, default=8)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--max-feature-nodes", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--n-layers", type=int, default=None,
                   help="fewer layers than GPT-2 small's 12: a smoke test (benchmarks/measure.py "
                   "--device cpu); the plan's figures then describe 12 layers")  # fmt: skip
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    overrides = {"n_layers": args.n_layers} if args.n_layers else {}
    if not args.device.startswith("cuda"):
        track_live_bytes_on_cpu()  # the resident set follows live tensors (see its doc)
    torch.manual_seed(0)
    model = architectures.build("gpt2-small", device=args.device, **overrides)
    for param in model.parameters():
        param.requires_grad_(False)
    tcs = transcoders(model, args.expansion * model.cfg.d_model, args.k)
    g = torch.Generator().manual_seed(1)
    tokens = [model.cfg.d_vocab - 1] + torch.randint(
        model.cfg.d_vocab - 1, (args.positions - 1,), generator=g
    ).tolist()
    seconds = {}
    with PeakMeter(args.device) as meter:
        start = time.perf_counter()
        graph = replacement.build(model, tcs, tokens, 11, 12, skip_bos=True,
                                  max_feature_nodes=args.max_feature_nodes,
                                  batch_size=args.batch)  # fmt: skip
        seconds["build"] = time.perf_counter() - start
        start = time.perf_counter()
        kinds = graph.kinds()
        pruned = prune.prune(graph.adjacency, kinds, 0.8, 0.98)
        scores = prune.scores(graph.adjacency, kinds)
        seconds["prune"] = time.perf_counter() - start
        start = time.perf_counter()
        split = heads.split_edges(graph, pruned.edge_mask, 8, args.batch, 32,
                                  pruned.node_influence)  # fmt: skip
        seconds["edge_heads"] = time.perf_counter() - start
        start = time.perf_counter()
        checked = validate.validate(graph, pruned.node_mask, pruned.node_influence, 10, 0.8)
        seconds["validation"] = time.perf_counter() - start
    config = pipeline_config(args)
    cfg = (
        architectures.config("gpt2-small", **overrides)
        if overrides
        else architectures.model_cfg(config)
    )
    planned = plan.graph_bytes(config, args.device)
    work_planned = sum(v for k, v in planned.items() if k != "weights")
    measured = meter.delta
    rows = graph.passes.get("graph_rows", 0) / 3
    result = {
        "benchmark": "prompt_graphs",
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": device_info(args.device),
        "model": "gpt2-small architecture, random weights; random TopK transcoders"
        + (f" ({args.n_layers} layers: a smoke test)" if args.n_layers else ""),
        "settings": vars(args) | {"json": str(args.json) if args.json else None},
        "graph": {
            "n_active_features": graph.n_features + graph.dropped_features,
            "n_features": graph.n_features,
            "dropped_features": graph.dropped_features,
            "n_nodes": graph.n_nodes,
            "kept_nodes": int(pruned.node_mask.sum()),
            "kept_edges": int(pruned.edge_mask.sum()),
            "cross_position_edges_split": len(split),
            "linearity_max_abs_error": linearity_error(graph),
            **scores,
            "validation_spearman": checked["spearman"],
        },
        "forward_equivalents": graph.passes,
        "forward_equivalents_total": sum(graph.passes.values()),
        "planned_graph_passes": plan.graph_passes(config, cfg, args.positions),
        "seconds": seconds,
        "seconds_per_row": seconds["build"] / max(rows, 1),
        "memory_mb": {
            "measured_work": measured / 2**20,
            "planned_work": work_planned / 2**20,
            "planned_parts": {k: v / 2**20 for k, v in planned.items()},
            "exact_peak": getattr(meter, "exact", True),
        },
        "plan_over_measured": work_planned / max(measured, 1),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
