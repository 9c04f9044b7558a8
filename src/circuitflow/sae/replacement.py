"""The replacement model's loss (rule transcoder_replacement, sae.kind transcoder): every MLP
replaced by its transcoder at once, on the held-out contexts each train_sae job measured its own
layer on. A transcoder's own metrics.json replaces its layer alone; errors compound through the
layers, and circuit-tracer's replacement model replaces them all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from circuitflow.capture.files import read_activation_info
from circuitflow.devices import resolve_device
from circuitflow.io import write_json
from circuitflow.perf import PassCounter
from circuitflow.sae.data import load_eval_contexts
from circuitflow.sae.files import load_sae
from circuitflow.sae.metrics import evaluate_transcoders


def run(
    config: dict,
    transcoder_dirs: list[Path | str],
    activations: Path | str,
    model_json: Path | str,
    out: Path | str,
) -> dict[str, Any]:
    """Write `out` (JSON): ce_clean, ce_sae (every MLP replaced), ce_zero (every such MLP
    output zeroed), ce_loss_recovered, per layer L0 and explained variance, and the passes."""
    from circuitflow.model.load import load_model

    info = read_activation_info(activations)  # whose held-out contexts, BOS handling
    device = resolve_device(config["device"])
    transcoders = {}
    for d in transcoder_dirs:
        tc = load_sae(d, device)
        transcoders[int(tc.cfg.metadata.hook_name_out.split(".")[1])] = tc
    model = load_model(Path(model_json).parent, device, config["model"]["dtype"])
    contexts = load_eval_contexts(info, config["sae"]["eval_contexts"])
    counter = PassCounter()
    metrics = evaluate_transcoders(
        model,
        dict(sorted(transcoders.items())),
        contexts,
        exclude_bos=info.bos_excluded,
        bos_token_id=info.bos_token_id,
        counter=counter,
    )
    metrics["layers"] = {str(k): v for k, v in metrics["layers"].items()}
    metrics |= counter.summary(len(contexts), unit="evaluation context")
    write_json(out, metrics)
    return metrics
