"""Short labels of features, from their evidence; a registry so an explainer can be added later.

A labeller is a function `(Evidence) -> str`. `LABELLERS` maps a name to one; the stage will
take the name from the config. `tokens` (the default) needs no language model and is
deterministic: the tokens the feature fires on most in its top contexts and the token it
promotes most, e.g. `fires on " Paris" / " London"; promotes " France"`. An explainer (a
language model reading the contexts) would be one more entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

__all__ = ["LABELLERS", "Evidence", "get", "token_label"]


@dataclass
class Evidence:
    """What a labeller may read about one feature: the token at each top context's maximum (in
    rank order, strongest first) and their activations, the promoted and suppressed tokens
    (strongest first), and the windows (token strings and activations) of the top contexts."""

    feature: int
    top_tokens: Sequence[str]
    top_values: Sequence[float]
    promoted: Sequence[str]
    suppressed: Sequence[str] = ()
    windows: Sequence[tuple[Sequence[str], Sequence[float]]] = field(default_factory=list)


def _show(token: str) -> str:
    return '"' + token.replace("\n", "\\n") + '"'


def token_label(ev: Evidence, n_tokens: int = 2) -> str:
    """`fires on "a" / "b"; promotes "c"`: the `n_tokens` tokens with the largest summed
    activation over the top contexts (ties: the earlier in rank), and the most promoted token;
    `dead` for a feature with no top contexts."""
    weight: dict[str, float] = {}
    for tok, val in zip(ev.top_tokens, ev.top_values, strict=True):
        weight[tok] = weight.get(tok, 0.0) + float(val)
    ranked = sorted(weight, key=lambda tok: -weight[tok])  # sorted() is stable: rank breaks ties
    parts = []
    if ranked:
        parts.append("fires on " + " / ".join(_show(t) for t in ranked[:n_tokens]))
    if ev.promoted and ranked:
        parts.append("promotes " + _show(ev.promoted[0]))
    return "; ".join(parts) if parts else "dead"


LABELLERS: dict[str, Callable[[Evidence], str]] = {
    "tokens": token_label,
}


def get(name: str) -> Callable[[Evidence], str]:
    try:
        return LABELLERS[name]
    except KeyError:
        raise ValueError(f"unknown labeller {name!r}; known: {sorted(LABELLERS)}") from None
