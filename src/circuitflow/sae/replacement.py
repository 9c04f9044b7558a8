"""The replacement model's loss (rule transcoder_replacement): every MLP
replaced by its transcoder at once, on the held-out contexts each train_sae job measured its own
layer on. A transcoder's own metrics.json replaces its layer alone; errors compound through the
layers, and circuit-tracer's replacement model replaces them all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from circuitflow.capture.files import read_activation_info
from circuitflow.devices import resolve_device
from circuitflow.io import write_json
from circuitflow.nodes import site_layer
from circuitflow.perf import PassCounter
from circuitflow.sae.data import load_eval_contexts
from circuitflow.sae.files import load_sae
from circuitflow.sae.metrics import evaluate_transcoders


def held_out(config: dict, activations=None, tokens=None) -> tuple:
    """(contexts, exclude_bos, bos_token_id) the dictionaries were measured on: the last
    `sae.eval_contexts` contexts of an activation file (sae.source capture), or of the token
    set, `tokens` = (npy, json) (sae.source stream)."""
    n = config["sae"]["eval_contexts"]
    if activations is not None:
        info = read_activation_info(activations)
        return load_eval_contexts(info, n), info.bos_excluded, info.bos_token_id
    from circuitflow.capture.tokens import last_contexts, read_token_set

    toks, meta = read_token_set(*tokens)
    return last_contexts(toks, n), config["capture"]["exclude_bos"], int(meta["bos_token_id"])


def run(
    config: dict,
    transcoder_dirs: list[Path | str],
    model_json: Path | str,
    out: Path | str,
    activations: Path | str | None = None,
    tokens: tuple[Path | str, Path | str] | None = None,
) -> dict[str, Any]:
    """Write `out` (JSON): ce_clean, ce_sae (every MLP replaced), ce_zero (every such MLP
    output zeroed), ce_loss_recovered, per layer L0 and explained variance, and the passes."""
    from circuitflow.model.load import load_model

    contexts, exclude_bos, bos = held_out(config, activations, tokens)
    device = resolve_device(config["device"])
    transcoders = {}
    for d in transcoder_dirs:
        tc = load_sae(d, device)
        transcoders[site_layer(tc.cfg.metadata.hook_name_out)[1]] = tc
    model = load_model(Path(model_json).parent, device, config["model"]["dtype"])
    counter = PassCounter()
    metrics = evaluate_transcoders(
        model,
        dict(sorted(transcoders.items())),
        contexts,
        exclude_bos=exclude_bos,
        bos_token_id=bos,
        counter=counter,
    )
    metrics["layers"] = {str(k): v for k, v in metrics["layers"].items()}
    metrics |= counter.summary(len(contexts), unit="evaluation context")
    write_json(out, metrics)
    return metrics
