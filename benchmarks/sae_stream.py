"""Streaming SAE training against capture-then-train, side by side in one run (issue 29, item 5).

    python benchmarks/sae_stream.py --json benchmarks/results/sae_stream-cpu.json   # CPU
    python benchmarks/sae_stream.py --device cuda --tokens 1048576 --batch 4096 \
        --json benchmarks/results/sae_stream-cuda.json                              # a GPU node
    python benchmarks/sae_stream.py --layers 2 --tokens 131072 --batch 512 --rounds 1 \
        --json benchmarks/results/sae_stream-cpu-2layers.json    # SAEs trained 256 steps: quality
    python benchmarks/sae_stream.py --layers 2 --tokens 16384 --rounds 1            # a quick check

GPT-2 small's architecture with random weights (architectures.config("gpt2-small"): 12 layers,
d_model 768, its 50,257-token vocabulary; no download) and the ready config's SAEs (TopK, 32x,
k=32, `--trainer`: by default the gpu trainer, whose stack steps a job's SAEs as one) on
resid_post of every layer, each path trained on the same distinct tokens (one token set:
`--tokens` rows a layer as whole contexts of 128, and held-out contexts for the evaluation),
with the stages' own code and their precision: the model in `model.dtype: auto` (bf16 on a
recent GPU) with TF32 on (as model.load sets them), the SAEs under `sae.autocast` (on for CUDA:
bf16 products, float32 weights), as a GPU run of the ready configs with autocast on trains:

- (a) `capture_then_train`: capture.stage.capture writes the 12 layers' HDF5 files in one
  forward pass per batch, then sae.stage.train trains each SAE from its file (ActivationStream),
  one after the other, as the train_sae jobs would on one device;
- (b) `stream_one_pass`: sae.stream_stage.train trains the 12 SAEs in one job from one stream
  of forward passes (sae.stream.ModelActivationStream, stop_at_layer 12);
- (c) `stream_per_layer`: 12 one-layer streaming jobs, each running the model as deep as its
  layer (stop_at_layer 1, ..., 12).

Each path's wall time covers its forward passes, writing and reading files, the activation
scaling's estimate and the training steps, up to the device's last kernel; loading the model
and evaluating are left out of every path. Every figure is written to `--json` as it comes.
Throughput is SAE training tokens a second (12 x `--tokens` over the wall time).
Rounds alternate which path goes first ((a)(b)(c), (c)(b)(a), ...) and the ratios are medians
of the per-round ratios: `stream_vs_capture` is (b)'s throughput over (a)'s,
`one_pass_vs_per_layer` (b)'s over (c)'s. `activation_bytes_written` is the size on disk of the
activation files each path leaves (the stream paths write none), and `explained_variance_delta`
is (a)'s mean explained variance minus (b)'s, each SAE measured on the held-out contexts' rows
(stored as the capture stores them, float16) after the same number of tokens. The counted
forward-pass equivalents (perf.PassCounter: a pass through L of 12 layers counts L/12) of each
path are beside them, and `forward_flop_bound` is the ratio (b)/(c) would reach if FLOPs were
all that counted: (c)'s matrix FLOPs (forward passes, and the fast trainer's SAE steps,
`fast_topk_flops_per_token`) over (b)'s.

The default budget (16 steps of 4096 rows an SAE) is for the speed figures: its SAEs are far from
converged (explained variance below 0 in most layers), so their `explained_variance_delta` is
the noise of ten warm-up steps, not a difference between the paths. Compare the paths' quality on
the 2-layer run above, whose SAEs take 256 steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # before tqdm is imported: it reads this once

import numpy as np  # noqa: E402
import torch  # noqa: E402
from sae_train import device_info  # noqa: E402  (benchmarks/ is on sys.path as the script's folder)

from circuitflow.capture.config import CaptureConfig  # noqa: E402
from circuitflow.capture.files import read_activation_info  # noqa: E402
from circuitflow.capture.stage import capture  # noqa: E402
from circuitflow.capture.tokens import token_set_hash  # noqa: E402
from circuitflow.devices import enable_fast_math, resolve_dtype  # noqa: E402
from circuitflow.io import write_json  # noqa: E402
from circuitflow.model import architectures  # noqa: E402
from circuitflow.model.flops import forward_flops_per_token  # noqa: E402
from circuitflow.nodes import hook_name  # noqa: E402
from circuitflow.perf import synchronize  # noqa: E402
from circuitflow.sae import stage as sae_stage  # noqa: E402
from circuitflow.sae import stream_stage  # noqa: E402
from circuitflow.sae.config import SAETrainConfig  # noqa: E402
from circuitflow.sae.inputs import Inputs  # noqa: E402
from circuitflow.sae.stream_plan import StreamGroup  # noqa: E402

PATHS = ("capture_then_train", "stream_one_pass", "stream_per_layer")
SITE = "resid_post"
CONTEXT = 128  # tokens a context, BOS first (the ready configs' capture.context_length)
NO_GPU = (
    "No GPU was available in this session: every figure is from the CPU. On a GPU the forward "
    "passes and the SAE steps both speed up, and writing and reading the activation files do "
    "not, so the stream's advantage over capture should grow there; run the GPU command in the "
    "docstring on a GPU node and commit its JSON."
)


@dataclasses.dataclass
class PathRun:
    wall_s: float
    saes: dict[str, object]  # hook -> the trained (training) SAE
    forward_equivalents: float  # counted passes per training context
    activation_bytes: int
    parts: dict[str, float]  # seconds by part (capture, train)


def model_and_tokens(args):
    from transformer_lens import HookedTransformer

    dtype = resolve_dtype(args.model_dtype, args.device)
    cfg = architectures.config("gpt2-small", device=args.device, seed=0, dtype=dtype)
    model = HookedTransformer(cfg).eval()
    enable_fast_math(args.device)
    per_context = CONTEXT - 1  # BOS left out of the rows, as capture.exclude_bos does
    n_train = -(-args.tokens // per_context)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.d_vocab - 1, (n_train + args.eval_contexts, CONTEXT))
    tokens = tokens.astype(np.int32)
    tokens[:, 0] = cfg.d_vocab - 1  # GPT-2's <|endoftext|>, its BOS
    meta = {"model_hash": "bench", "token_set_hash": token_set_hash(tokens),
            "bos_token_id": cfg.d_vocab - 1, "held_out_contexts": args.eval_contexts}  # fmt: skip
    return model, tokens, meta, n_train


def sae_config(args) -> SAETrainConfig:
    return SAETrainConfig.from_dict(
        {"architecture": "topk", "expansion_factor": args.expansion, "k": args.k,
         "batch_size": args.batch, "total_tokens": args.tokens, "trainer": args.trainer,
         "autocast": args.device.startswith("cuda"), "checkpoint_every_tokens": 10**12,
         "stream": {"batch_contexts": args.batch_contexts}},
        device=args.device,
    )  # fmt: skip


def run_capture_then_train(model, tokens, meta, n_train, args, tmp: Path) -> PathRun:
    """(a): the capture stage's files for every layer, then each SAE from its file."""
    targets = {(SITE, layer): tmp / "acts" / f"layer_{layer}.h5" for layer in range(args.layers)}
    opts = CaptureConfig(batch_size=args.batch_contexts, dtype="float16")
    cfg = sae_config(args)
    t0 = time.perf_counter()
    result = capture(model, tokens[:n_train], meta, targets, opts, progress=False)
    t1 = time.perf_counter()
    saes = {}
    for (_, layer), path in sorted(targets.items()):
        info = read_activation_info(path)
        run = sae_stage.train(cfg, Inputs(info), args.device, tmp / f"ck{layer}",
                              sae_stage.capture_fingerprint(cfg, info), None, {})  # fmt: skip
        saes[info.hook_name] = run.trainer.sae
    synchronize(args.device)
    t2 = time.perf_counter()
    written = sum(p.stat().st_size for p in targets.values())
    fe = result.cost["forward_equivalents_per_prompt"]
    return PathRun(t2 - t0, saes, fe, written, {"capture_s": t1 - t0, "train_s": t2 - t1})


def run_stream(model, tokens, meta, groups: list[StreamGroup], args, tmp: Path) -> PathRun:
    """(b) with one group of every layer, (c) with one group a layer."""
    cfg = sae_config(args)
    capture_cfg = CaptureConfig(dtype="float16")
    src = stream_stage.stream_source(tokens, meta, capture_cfg)
    saes, forward = {}, 0.0
    t0 = time.perf_counter()
    for i, group in enumerate(groups):
        p = stream_stage.plan(cfg, capture_cfg, src, group, model, args.device, None)
        run = stream_stage.train(cfg, src, group, p, model, args.device, tmp / f"ck{i}", "fp",
                                 None, {})  # fmt: skip
        saes |= {hook: tr.sae for hook, tr in run.trainer.trainers.items()}
        forward += run.counter.total()
    synchronize(args.device)
    wall = time.perf_counter() - t0
    # The paths wrote no activation file: count whatever .h5 they left, to show it.
    written = sum(p.stat().st_size for p in tmp.rglob("*.h5"))
    return PathRun(wall, saes, forward / src.n_train, written, {})


def fast_topk_flops_per_token(d_in: int, d_sae: int, k: int, batch: int) -> float:
    """Matrix FLOPs of a TopK training row in sae.fast's trainer: the dense encoder forward
    (2 d_in d_sae), the sparse decoder forward and both backwards at the k selected latents and
    the k_aux = d_in / 2 AuxK latents (five gather or scatter products of 2 d_in each, the AuxK
    loss on from the first dead latents on), and Adam's step over the 2 d_in d_sae weights
    (about 10 FLOPs a weight) spread over the batch. perf.sae_training_flops_per_token counts
    the dense work SAELens's step does instead (12 d_in d_sae)."""
    sparse = 5 * 2 * d_in * (k + d_in // 2)
    return 2 * d_in * d_sae + sparse + 10 * 2 * d_in * d_sae / batch


@torch.no_grad()
def explained_variance(sae, x: torch.Tensor) -> float:
    """1 - squared error / total variance about the mean, sums in float64."""
    err = 0.0
    for start in range(0, len(x), 1024):
        rows = x[start : start + 1024]
        err += (sae.decode(sae.encode(rows)) - rows).double().pow(2).sum().item()
    xd = x.double()
    return 1.0 - err / (xd - xd.mean(0)).pow(2).sum().item()


@torch.no_grad()
def held_out_rows(model, tokens, args) -> dict[str, torch.Tensor]:
    """Every layer's rows of the held-out contexts, BOS left out, stored as float16 (as both
    paths store what they train on), widened to float32."""
    hooks = [hook_name(SITE, layer) for layer in range(args.layers)]
    ctx = torch.from_numpy(tokens[-args.eval_contexts :].astype(np.int64)).to(args.device)
    _, cache = model.run_with_cache(ctx, names_filter=hooks, stop_at_layer=args.layers)
    return {h: cache[h][:, 1:].reshape(-1, model.cfg.d_model).half().float() for h in hooks}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--layers", type=int, default=12, help="SAEs: resid_post of layers 0..N-1")
    p.add_argument("--tokens", type=int, default=65536, help="training tokens a layer")
    p.add_argument("--batch", type=int, default=4096, help="SAE batch (rows; the ready configs')")
    p.add_argument("--batch-contexts", type=int, default=16, help="contexts a forward pass")
    p.add_argument("--expansion", type=int, default=32)
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--trainer", default="gpu", choices=["gpu", "fast", "saelens"])
    p.add_argument("--model-dtype", default="auto", help="model.dtype (auto: bf16 on a GPU)")
    p.add_argument("--eval-contexts", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int)
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    model, tokens, meta, n_train = model_and_tokens(args)
    held_out = held_out_rows(model, tokens, args)
    hooks = [hook_name(SITE, layer) for layer in range(args.layers)]
    members = [(SITE, layer) for layer in range(args.layers)]
    one_pass = [StreamGroup(tuple(members))]
    per_layer = [StreamGroup((m,)) for m in members]
    runs: dict[str, list[PathRun]] = {k: [] for k in PATHS}
    evs: dict[str, list[float]] = {}  # each path's last run's explained variance per layer
    order: list[list[str]] = []
    for r in range(args.rounds):
        paths = PATHS if r % 2 == 0 else PATHS[::-1]
        order.append(list(paths))
        for name in paths:
            with tempfile.TemporaryDirectory() as tmp:
                if name == "capture_then_train":
                    run = run_capture_then_train(model, tokens, meta, n_train, args, Path(tmp))
                else:
                    groups = one_pass if name == "stream_one_pass" else per_layer
                    run = run_stream(model, tokens, meta, groups, args, Path(tmp))
            runs[name].append(run)
            evs[name] = [explained_variance(run.saes[h], held_out[h]) for h in hooks]
            run.saes = {}  # the SAEs' memory back before the next path
            print(
                f"round {r} {name:20s} {run.wall_s:8.1f} s "
                f"{args.layers * args.tokens / run.wall_s:10,.0f} SAE tokens/s, forward "
                f"equivalents {run.forward_equivalents:.3f} a context",
                flush=True,
            )
            out = summary(runs, evs, order, n_train, args, t_start)
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                write_json(args.json, out)
    print(
        f"stream vs capture {out['stream_vs_capture']:.2f}x, one pass vs per layer "
        f"{out['one_pass_vs_per_layer']:.2f}x (FLOP bound {out['forward_flop_bound']:.2f}), "
        f"EV delta {out['explained_variance_delta']:+.4f}; total {out['seconds']:.0f} s",
        flush=True,
    )


def summary(runs: dict[str, list[PathRun]], evs: dict[str, list[float]], order, n_train: int,
            args, t_start: float) -> dict:  # fmt: skip
    """The JSON from the runs so far (ratios of the rounds both paths have run)."""

    def rate(run: PathRun) -> float:
        return args.layers * args.tokens / run.wall_s

    def ratios(a: str, b: str) -> list[float]:
        return [rate(x) / rate(y) for x, y in zip(runs[a], runs[b], strict=False)]

    def median(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    cfg = architectures.config("gpt2-small")
    d_sae = args.expansion * cfg.d_model
    forward = forward_flops_per_token(cfg, CONTEXT, None, unembed=False) / cfg.n_layers
    sae_flops = args.layers * fast_topk_flops_per_token(cfg.d_model, d_sae, args.k, args.batch)
    depth_one = args.layers * forward
    depth_each = sum(layer + 1 for layer in range(args.layers)) * forward
    paths = {}
    for name, done in runs.items():
        if not done:
            continue
        paths[name] = {
            "wall_s": statistics.median(run.wall_s for run in done),
            "wall_s_per_round": [run.wall_s for run in done],
            "tokens_per_s": statistics.median(rate(run) for run in done),
            "activation_bytes_written": done[-1].activation_bytes,
            "forward_equivalents_per_context": done[-1].forward_equivalents,
            "explained_variance": statistics.fmean(evs[name]),
            "explained_variance_per_layer": evs[name],
            **{k: statistics.median(run.parts[k] for run in done) for k in done[-1].parts},
        }
    stream_vs_capture = median(ratios("stream_one_pass", "capture_then_train"))
    one_pass_vs_per_layer = median(ratios("stream_one_pass", "stream_per_layer"))
    ev = {name: p["explained_variance"] for name, p in paths.items()}
    delta = ev.get("capture_then_train", 0.0) - ev.get("stream_one_pass", 0.0)
    model_dtype = str(resolve_dtype(args.model_dtype, args.device)).removeprefix("torch.")
    return {
        "benchmark": "sae_stream",
        "command": "python benchmarks/sae_stream.py " + " ".join(sys.argv[1:]),
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"gpu": None} | device_info(args.device),
        "note": None if args.device.startswith("cuda") else NO_GPU,
        "dimensions": {
            "model": "gpt2-small architecture, random weights (seed 0)",
            "model_dtype": model_dtype,
            "tf32": args.device.startswith("cuda") and torch.backends.cuda.matmul.allow_tf32,
            "sae_autocast": args.device.startswith("cuda"),
            "n_layers": cfg.n_layers,
            "d_model": cfg.d_model,
            "context_length": CONTEXT,
            "saes": [f"{SITE} layer {layer}" for layer in range(args.layers)],
            "architecture": "topk",
            "trainer": args.trainer,
            "d_sae": d_sae,
            "k": args.k,
            "batch_size": args.batch,
            "batch_contexts": args.batch_contexts,
            "tokens_per_sae": args.tokens,
            "training_contexts": n_train,
            "held_out_contexts": args.eval_contexts,
        },  # fmt: skip
        "rounds": args.rounds,
        "order_per_round": order,
        "paths": paths,
        "stream_vs_capture": stream_vs_capture,
        "stream_vs_capture_per_round": ratios("stream_one_pass", "capture_then_train"),
        "one_pass_vs_per_layer": one_pass_vs_per_layer,
        "one_pass_vs_per_layer_per_round": ratios("stream_one_pass", "stream_per_layer"),
        # (c)'s counted FLOPs over (b)'s: the ratio if only the forward passes differed.
        "forward_flop_bound": (depth_each + sae_flops) / (depth_one + sae_flops),
        "explained_variance_delta": delta,
        "goals": {
            "stream_vs_capture_at_least_1": (stream_vs_capture or 0) >= 1.0,
            "stream_writes_no_activation_bytes": paths.get("stream_one_pass", {}).get(
                "activation_bytes_written"
            )
            == 0,
            "one_pass_vs_per_layer_at_least_2": (one_pass_vs_per_layer or 0) >= 2.0,
            "explained_variance_delta_within_0.005": abs(delta) <= 0.005,
            "stream_one_pass_at_least_1M_sae_tokens_per_s": paths.get("stream_one_pass", {}).get(
                "tokens_per_s", 0
            )
            >= 1e6,
        },  # fmt: skip
        "seconds": time.perf_counter() - t_start,
    }


if __name__ == "__main__":
    main()
