"""Planning a stage's batches: a stage's peak memory as a function of its batch size
(`Estimate`), the largest batch that fits (`plan_batch_size`), and the estimate of a model's
no-grad forward pass (`estimate_forward`) that capture and interventions size their batches by.
Each stage's own estimate lives beside its code (`<stage>/plan.py`); this module knows no stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from circuitflow import dictionary_sources
from circuitflow.memory.probes import MiB, available_bytes
from circuitflow.perf import dtype_name
from circuitflow.sites import capture_sites, dictionary_sites, sae_sites, trains_transcoders

if TYPE_CHECKING:
    import torch

# Bytes of one element by dtype name (torch's element_size): a table, so that planning (every
# Snakemake invocation re-plans each job) never imports torch.
DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Bytes of one element of `dtype`, a torch dtype or its name."""
    return DTYPE_BYTES[dtype_name(dtype)]


@dataclass(frozen=True)
class Estimate:
    """Peak memory of a stage's batched work as a function of its batch size n (contexts, rows
    or prompts): `fixed + per_item * n` bytes where the limit applies (the GPU on CUDA; host and
    device together on CPU, where they are the same memory), or the peak of a phase that does not
    grow with n (an optimiser step) when that is higher."""

    weights: int  # parameters on the compute device (model, SAEs)
    per_context_device: int  # working bytes of one more item on the compute device
    per_context_host: int  # host bytes of one more item (captured rows awaiting the write)
    buffers: int  # fixed host bytes (write caches, shuffle buffers)
    device: str
    fixed_device: int = 0  # other fixed device bytes: optimiser state, weight copies
    other_phases: tuple[int, ...] = ()  # peaks of phases independent of n, where the limit applies
    item: str = "context"

    def fixed(self) -> int:
        host = 0 if self.device.startswith("cuda") else self.buffers
        return self.weights + self.fixed_device + host

    def per_context(self) -> int:
        """Bytes one more item costs where the limit applies."""
        if self.device.startswith("cuda"):
            return self.per_context_device
        return self.per_context_device + self.per_context_host

    per_item = per_context

    def total(self, batch_size: int) -> int:
        return max(self.fixed() + self.per_context() * batch_size, *self.other_phases, 0)

    def host(self, batch_size: int) -> int:
        """Host bytes at `batch_size` (on CPU part of `total`)."""
        return self.buffers + self.per_context_host * batch_size

    def host_peak(self, batch_size: int) -> int:
        """What the work adds to the host's memory at `batch_size` (a job's Slurm memory): the
        host's share on a GPU, everything on CPU, where host and device are one memory."""
        return self.host(batch_size) if self.device.startswith("cuda") else self.total(batch_size)


def model_dims(cfg) -> tuple[int, int, int, int, int, int]:
    d, h = cfg.d_model, cfg.n_heads
    d_head = getattr(cfg, "d_head", None) or d // h
    kv = getattr(cfg, "n_key_value_heads", None) or h
    return d, h, d_head, kv, cfg.d_mlp or 4 * d, cfg.d_vocab


def mlp_copies(cfg, grad: bool) -> int:
    """MLP-width tensors per token alive at the MLP's peak. TransformerLens computes gelu_new as
    eight eager elementwise ops and a gated MLP as silu(gate) * up, so both hold four d_mlp-wide
    tensors at once without grad, and save four (gelu_new) or three (gated) for backward; a
    single-op activation (gelu, relu, silu, PyTorch's tanh gelu) holds two and saves one."""
    if getattr(cfg, "gated_mlp", False):
        return 3 if grad else 4
    if getattr(cfg, "act_fn", None) in ("gelu", "relu", "silu", "gelu_pytorch_tanh"):
        return 1 if grad else 2
    return 4  # gelu_new, gelu_fast, solu and unknown ones: the eager elementwise chains


def weight_copy_bytes(cfg, c: int, unembed: bool) -> int:
    """The largest weight TransformerLens copies per call (`.T.contiguous()`: W_O, the gated
    MLP's matrices, W_U): alive next to the activations of the layer that uses it."""
    d, h, dh, _kv, m, v = model_dims(cfg)
    largest = max(h * dh * d, d * m if getattr(cfg, "gated_mlp", False) else 0)
    return max(largest, d * v if unembed else 0) * c


def estimate_forward(
    model_cfg,
    n_params: int,
    context_length: int,
    stop_at_layer: int | None,
    n_captured: int,
    compute_dtype: torch.dtype | str,
    storage_dtype: torch.dtype | str,
    device: str,
    buffers: int = 0,
) -> Estimate:
    """Peak memory of a no-grad forward pass (the capture stage) from a HookedTransformerConfig.

    Counted from how TransformerLens computes a block eagerly (checked against measured peaks on
    CPU by tests/test_memory_accuracy.py), in tensors of one context:
    - attention: the residual stream, the three LayerNorm outputs (q, k and v get one each),
      q, k, v (GQA: fewer k/v heads), and the scores' softmax chain (masked scores, pattern,
      its NaN mask and the cleaned pattern: 4.25 [heads, t, t] tensors) or, with rotary
      positions, the rotation's four temporaries of q, whichever is larger;
    - MLP: four residual-width tensors and the activation's d_mlp-wide temporaries;
    plus each captured hook's output awaiting its write (`storage_dtype`, on the host), one
    weight copy (`weight_copy_bytes`), and the logits when the unembedding runs.
    """
    c = dtype_bytes(compute_dtype)
    t = context_length
    d, h, dh, kv, m, v = model_dims(model_cfg)
    rotary = getattr(model_cfg, "positional_embedding_type", "") == "rotary"
    q = t * h * dh
    attn = 4 * t * d + q + 2 * t * kv * dh + max(4.25 * h * t * t, 4 * q if rotary else 0)
    mlp = 4 * t * d + mlp_copies(model_cfg, grad=False) * t * m
    per_device = max(attn, mlp) * c
    if stop_at_layer is None:
        per_device += 2 * t * v * max(c, 4)  # logits and their fp32 copy in the loss
    captured = n_captured * t * d * dtype_bytes(storage_dtype)
    if device.startswith("cuda"):
        per_device += t * d * dtype_bytes(storage_dtype)  # one hook's copy before it moves
    return Estimate(
        weights=n_params * c,
        per_context_device=int(per_device),
        per_context_host=captured,
        buffers=buffers,
        device=device,
        fixed_device=weight_copy_bytes(model_cfg, c, unembed=stop_at_layer is None),
    )


# SAE training: tensors of width d_sae per training row alive at the step's peak (each
# architecture's `wide_per_row` in circuitflow.sae.architectures), plus d_in-wide ones (input,


@dataclass(frozen=True)
class BatchPlan:
    batch_size: int
    estimate_bytes: int
    available_bytes: int
    budget_bytes: int
    item: str = "context"

    def describe(self) -> str:
        return (
            f"memory plan: batch {self.batch_size} {self.item}s, estimated peak "
            f"{self.estimate_bytes / MiB:.0f} MiB of a {self.budget_bytes / MiB:.0f} MiB budget "
            f"({self.available_bytes / MiB:.0f} MiB available)"
        )


def plan_batch_size(
    estimate: Estimate,
    max_batch_size: int,
    fraction: float = 0.8,
    available: int | None = None,
) -> BatchPlan:
    """The largest power-of-two batch size (at most `max_batch_size`) whose estimated peak fits
    in `fraction` of the available memory; raises MemoryError when not even one item fits."""
    available = available_bytes(estimate.device) if available is None else available
    budget = int(available * fraction)
    if estimate.total(1) > budget:
        raise MemoryError(
            f"not enough memory on {estimate.device}: the work needs about "
            f"{estimate.total(1) / MiB:.0f} MiB for one {estimate.item}, {budget / MiB:.0f} MiB "
            "is available; use a larger machine, a smaller dtype or a shorter context"
        )
    batch = 1
    while batch * 2 <= max_batch_size and estimate.total(batch * 2) <= budget:
        batch *= 2
    return BatchPlan(batch, estimate.total(batch), available, budget, estimate.item)


def model_dtype_name(config: dict, device: str) -> str:
    """The name of the dtype the configured model computes in on `device` (`model.dtype`;
    `auto`: fp32 on CPU and, planned before the GPU is known, 16-bit on a GPU, as
    devices.resolve_dtype picks on Ampere and newer). What the plans use: a name, no torch."""
    spec = config["model"]["dtype"]
    if spec != "auto":
        return spec
    return "bfloat16" if device.startswith("cuda") else "float32"


def model_dtype(config: dict, device: str) -> torch.dtype:
    """model_dtype_name as the torch dtype the stages compute in."""
    import torch

    return getattr(torch, model_dtype_name(config, device))


# Tokens a prompt is planned at before the prompts exist: the real models' IOI and capitals
# prompts are shorter (16 to 20 tokens); the embedded model's prompts fill its context.
PLANNED_PROMPT_LENGTH = 32


def prompt_length(config: dict, model_cfg) -> int:
    """The prompt length batches and walltimes are planned at (PLANNED_PROMPT_LENGTH; the
    embedded model: its context)."""
    embedded = config["model"]["name"] == "embedded"
    return model_cfg.n_ctx if embedded else PLANNED_PROMPT_LENGTH


def n_hooks(config: dict) -> int:
    """Hook points attribution and interventions splice SAEs at: every configured layer at
    every SAE site (sites.sae_sites; none in a run of transcoders alone)."""
    return len(config["layers"]) * len(sae_sites(config))


def n_dictionaries(config: dict) -> int:
    """Dictionaries the run trains or loads: every layer at every site, transcoders included."""
    return len(config["layers"]) * len(dictionary_sites(config))


def n_transcoders(config: dict) -> int:
    """Transcoders the run trains: one per layer (sae.kind transcoder or both), else none."""
    return len(config["layers"]) if trains_transcoders(config) else 0


def capture_hooks(config: dict) -> int:
    """Hook points capture writes: every dictionary's, and a transcoder's input hook too."""
    return len(config["layers"]) * len(capture_sites(dictionary_sources.capture_part(config)))


def n_prompts(config: dict, behaviour: str | None, cap: int | None = None) -> int:
    """The behaviour's prompts (the largest behaviour's when none is named), at most `cap`."""
    specs = config["behaviours"]
    names = [behaviour] if behaviour in specs else list(specs)
    n = max(specs[name]["n_prompts"] for name in names)
    return min(n, cap) if cap else n
