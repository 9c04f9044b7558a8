"""The explainer's plan (rules explain_features_*, features/explainer.py): host memory and counted
work of one job, which explains and scores every live feature of its group's dictionaries.

The job holds the explainer (its weights on the GPU, loaded through the host) and one
dictionary's tables at a time. Its work, per feature of the group: one explanation (a prompt of
`contexts` windows, EXPLAIN_TOKENS a window, and `max_new_tokens` generated, each a forward pass
over the growing sequence, counted as one pass over prompt and answer) and 4 x `examples`
detection prompts (its own explanation and the control's, on as many firing and quiet
examples), DETECT_TOKENS each; 2 FLOPs a parameter a token, in bfloat16."""

from __future__ import annotations

from circuitflow.description import describe
from circuitflow.memory import load_bytes
from circuitflow.model import architectures
from circuitflow.perf import Work

EXPLAIN_TOKENS = 40  # prompt tokens per context window shown (17 tokens, markers, numbering)
DETECT_TOKENS = 120  # tokens of a detection prompt (explanation, one window, the question)
TABLE_BYTES_PER_FEATURE = 60_000  # a dictionary's tables in pandas (contexts and examples)


def explainer_cfg(config: dict):
    """The explainer's shape, from its config.json where it is a local directory (else a
    known architecture, else a guess: circuitflow.model.architectures.model_cfg)."""
    name = config["features"]["labeller"]
    return architectures.model_cfg({"model": {"name": name, "n_layers": None}, "layers": [0]})


def widest(config: dict, job: str | None) -> tuple[int, int]:
    """(features of the group's dictionaries together, the widest one's)."""
    from circuitflow.features.plan import group_of

    members = group_of(config, job).members
    widths = {(d.site, d.layer): d.width for d in describe(config).dictionaries}
    sizes = [widths.get(m, 0) for m in members]
    return sum(sizes), max(sizes, default=0)


def job_bytes(config: dict, rule: str, device: str, job: str | None = None) -> int:
    """The explainer's load through the host, and one dictionary's tables."""
    n_params = architectures.n_params(explainer_cfg(config))
    return load_bytes(n_params) + widest(config, job)[1] * TABLE_BYTES_PER_FEATURE


def job_work(config: dict, rule: str, job: str | None = None) -> Work:
    """Every feature's explanation and detection prompts (module docstring)."""
    e = config["features"]["explainer"]
    n_params = architectures.n_params(explainer_cfg(config))
    features = widest(config, job)[0]
    explain = e["contexts"] * EXPLAIN_TOKENS + e["max_new_tokens"]
    detect = 4 * e["examples"] * DETECT_TOKENS
    return Work({"bfloat16": 2.0 * n_params * features * (explain + detect)})
