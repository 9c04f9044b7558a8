"""Measure each stage's real peak memory on CPU next to the memory planner's estimate.

Run as a script (in a fresh process, so nothing else the test session allocated is counted):
prints one JSON object per line: stage, case, measured and planned bytes. The measurement is
memory.PeakMeter (the resident-set high-water mark, reset on entry) with glibc told to map every
block of 64 KiB or more on its own (memory.track_live_bytes_on_cpu), so the resident set
follows live tensors as CUDA's allocator statistics do. Weights created before a measured block
are added to what the block used, as the estimates count them.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from circuitflow import memory  # noqa: E402
from circuitflow.attribution import plan as attribution_plan  # noqa: E402
from circuitflow.model import architectures  # noqa: E402
from circuitflow.sae import plan as sae_plan  # noqa: E402


def emit(stage: str, case: str, measured: int, planned: int) -> None:
    record = {"stage": stage, "case": case, "measured": measured, "planned": planned}
    print(json.dumps(record | {"t": time.perf_counter()}))
    sys.stdout.flush()


def small_model(arch: str):
    from transformer_lens import HookedTransformer

    cfg = architectures.config(arch, n_layers=2, d_vocab=1000, device="cpu", seed=0)
    model = HookedTransformer(cfg).eval()
    return model, sum(p.numel() * p.element_size() for p in model.parameters())


def capture(arch: str, tmp: Path) -> None:
    from circuitflow.capture.config import CaptureConfig
    from circuitflow.capture.stage import capture as run_capture

    model, weights = small_model(arch)
    tokens = np.random.default_rng(0).integers(1, 1000, (32, 128)).astype(np.int32)
    tokens[:, 0] = 0
    targets = {("resid_post", layer): tmp / f"{arch}_{layer}.h5" for layer in range(2)}
    meta = {"model_hash": "m", "token_set_hash": "t", "bos_token_id": 0}
    with memory.PeakMeter("cpu") as meter:
        result = run_capture(
            model, tokens, meta, targets, CaptureConfig(batch_size=16), progress=False
        )
    emit("capture", arch, meter.delta + weights, int(result.planned_peak_mb * memory.MiB))


def sae(case: str, tmp: Path) -> None:
    """`case`: an architecture, trained as the stage does (`sae.trainer: auto`), or
    "{architecture} saelens" for SAELens's trainer, or "{architecture} transcoder" for a
    transcoder (two files read in lockstep)."""
    from circuitflow.capture.files import read_activation_info, write_activation_file
    from circuitflow.sae.architectures import build_training_sae
    from circuitflow.sae.config import SAETrainConfig
    from circuitflow.sae.data import ActivationStreamConfig
    from circuitflow.sae.inputs import Inputs
    from circuitflow.sae.stage import memory_estimate
    from circuitflow.sae.trainer import trainer_config
    from circuitflow.sae.trainers import build_trainer

    d_in, rows, batch = 128, 8192, 2048
    infos = []
    for i, site in enumerate(("resid_post", "mlp_out")):
        path = tmp / f"{site}.h5"
        if not path.exists():
            acts = np.random.default_rng(i).standard_normal((rows, d_in)).astype(np.float16)
            attrs = {"hook_name": f"blocks.0.hook_{site}", "layer": 0, "site": site,
                     "model_hash": "m", "token_set_hash": "t", "context_length": 129,
                     "bos_excluded": True, "bos_token_id": 0}  # fmt: skip
            write_activation_file(path, acts, np.zeros(rows, np.int32), attrs, chunk_rows=512)
        infos.append(read_activation_info(path))
    info = infos[0]
    # A one-step dead window and k=1 (fewer firings than latents): latents are dead from the
    # first step on, so TopK's auxiliary loss runs, as it does in real training.
    architecture, _, variant = case.partition(" ")
    transcoder = variant == "transcoder"
    cfg = SAETrainConfig(
        architecture=architecture, d_sae=4096, k=1, batch_size=batch, total_tokens=3 * batch,
        dead_window_tokens=batch, shuffle_buffer_tokens=4096, device="cpu",
        trainer="auto" if transcoder else variant or "auto",
        kind="transcoder" if transcoder else "sae",
    )  # fmt: skip
    tcfg = trainer_config(cfg, info, "cpu")
    stream_cfg = ActivationStreamConfig(batch_size=batch, shuffle_buffer_tokens=4096)
    inputs = Inputs(info, infos[1] if transcoder else None)
    hook_out = infos[1].hook_name if transcoder else ""
    with memory.PeakMeter("cpu") as meter:
        stream = inputs.stream(stream_cfg, 0)
        model = build_training_sae(cfg, d_in, info.hook_name, "cpu", hook_out)
        build_trainer(cfg, tcfg, model, stream).fit()
        stream.close()
        del model
    emit("sae_train", case, meter.delta, memory_estimate(cfg, info, "cpu").total(batch))


def stream(arch: str, kind: str = "sae", trainer: str = "auto") -> None:
    """The streaming SAE job's training (sae.source: stream): two layers' fast TopK SAEs (or
    transcoders, `kind`: each reads two hooks; or the gpu trainer's stack of both, `trainer`:
    measured at 0.92 of its plan, 2026-11-28, not in the suite for its CPU) from one stream of
    the model's forward passes, its shuffle buffers refilled as it goes."""
    from circuitflow.capture.config import CaptureConfig
    from circuitflow.sae.config import SAETrainConfig
    from circuitflow.sae.stream_plan import StreamGroup
    from circuitflow.sae.stream_stage import plan, stream_source, train

    model, weights = small_model(arch)
    tokens = np.random.default_rng(0).integers(1, 1000, (72, 128)).astype(np.int32)
    tokens[:, 0] = 0
    meta = {"model_hash": "m", "token_set_hash": "t", "bos_token_id": 0, "held_out_contexts": 8}
    batch = 2048
    cfg = SAETrainConfig(
        architecture="topk", d_sae=4096, k=1, batch_size=batch, total_tokens=6 * batch,
        dead_window_tokens=batch, shuffle_buffer_tokens=4096, device="cpu",
        normalize_activations="none", kind=kind, trainer=trainer,
    )  # fmt: skip
    cfg.stream.batch_contexts = 16
    src = stream_source(tokens, meta, CaptureConfig())
    site = "mlp_out" if kind == "transcoder" else "resid_post"
    group = StreamGroup(((site, 0), (site, 1)))
    with tempfile.TemporaryDirectory() as tmp, memory.PeakMeter("cpu") as meter:
        p = plan(cfg, CaptureConfig(), src, group, model, "cpu", None)
        train(cfg, src, group, p, model, "cpu", Path(tmp), "fp", None, {})
    case = " ".join([arch] + [v for v in (kind, trainer) if v not in ("sae", "auto")])
    emit("sae_stream", case, meter.delta + weights, p.estimate.total(batch, 16))


def attribution(arch: str, method: str, n_prompts: int) -> None:
    from sae_lens import TopKSAE, TopKSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    from circuitflow.attribution import scores as attr
    from circuitflow.attribution.config import AttributionConfig
    from circuitflow.nodes import hook_name

    model, weights = small_model(arch)
    d, d_sae, t = model.cfg.d_model, 4096, 16
    saes = {}
    for layer in range(2):
        hook = hook_name("resid_post", layer)
        cfg = TopKSAEConfig(d_in=d, d_sae=d_sae, k=32, metadata=SAEMetadata(hook_name=hook))
        saes[hook] = TopKSAE(cfg).eval().requires_grad_(False)
    resident = weights + 2 * sae_plan.sae_param_bytes(d, d_sae)
    rng = np.random.default_rng(0)
    clean = rng.integers(1, 1000, (n_prompts, t))
    corrupted = clean.copy()
    corrupted[:, 1:8] = rng.integers(1, 1000, (n_prompts, 7))
    prompts = pd.DataFrame(
        {"prompt_id": np.arange(n_prompts),
         "clean_tokens": list(clean), "corrupted_tokens": list(corrupted),
         "answer_id": rng.integers(1, 1000, n_prompts),
         "distractor_id": rng.integers(1, 1000, n_prompts)}
    )  # fmt: skip
    acfg = AttributionConfig(
        method=method, ig_steps=1, validation_heads=0, validation_features=0, batch_size=n_prompts
    )
    with memory.PeakMeter("cpu") as meter:
        attr.score_nodes(model, prompts, saes, acfg)
    n_params = sum(p.numel() for p in model.parameters())
    kept = min(acfg.validation_prompts, n_prompts)  # every prompt's gradients are kept
    est = attribution_plan.estimate_attribution(
        model.cfg, n_params, t, 2, d_sae, torch.float32, "cpu", method, kept
    )
    emit("attribution", f"{arch} {method}", meter.delta + resident, est.total(n_prompts))


def main() -> None:
    torch.set_num_threads(1)
    if not memory.track_live_bytes_on_cpu():
        print(json.dumps({"skip": "glibc mallopt unavailable"}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        for arch in architectures.ARCHITECTURES:
            capture(arch, Path(tmp))
        for case in ("topk", "batchtopk", "topk saelens", "standard", "topk transcoder",
                     "topk gpu", "batchtopk gpu"):  # fmt: skip
            sae(case, Path(tmp))
    stream("gpt2-small")
    stream("gpt2-small", "transcoder")
    for arch in architectures.ARCHITECTURES:
        attribution(arch, "atp", 16)
    attribution("gpt2-small", "ig", 2)


if __name__ == "__main__":
    main()
