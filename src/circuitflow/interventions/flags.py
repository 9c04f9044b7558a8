"""Flags on the interventions' headline numbers: where a number says less than it seems to.

* A random control that reaches its circuit's value: random circuits of the same make-up are
  as faithful (or as complete) as the circuit, so that number does not tell the circuit from a
  random one (on the embedded induction circuit random circuits reached completeness 1.00
  against the circuit's 0.996 on one training, 1.01 against 0.994 on another: with most of the
  behaviour carried by a few nodes that every circuit of that make-up holds, completeness says
  nothing there).
* A faithfulness under the threshold the circuit size was chosen by: a circuit chosen on the
  selection half that falls under it on the held-out half (facts' 0.78 against 0.8 on one
  training of the embedded default, induction's 0.75 on another), a configured size that never
  reached it, and the attribution graph's own node set scored as a circuit (0.002 held out on
  induction).

`summary.json` holds them as `random_reaches_circuit`, `below_threshold` and `flags` (the
sentences the report and graph.html show); `flags_of` computes them from any summary, so an
older summary.json without them is flagged the same way.
"""

from __future__ import annotations

import math
from typing import Any

# (the circuit's key, its random control's key) in summary.json.
RANDOM_CONTROLS = (
    ("faithfulness", "random_faithfulness"),
    ("completeness", "random_completeness"),
    ("faithfulness_heldout", "random_faithfulness_heldout"),
    ("completeness_heldout", "random_completeness_heldout"),
    ("faithfulness_at_smallest", "random_faithfulness_at_smallest"),
)
# Faithfulness values judged against faithfulness_threshold ("graph_circuit." = inside it).
THRESHOLDED = (
    "faithfulness",
    "faithfulness_heldout",
    "graph_circuit.faithfulness",
    "graph_circuit.faithfulness_heldout",
)
WHAT = {
    "faithfulness": "the circuit's faithfulness (selection half)",
    "completeness": "the circuit's completeness (selection half)",
    "faithfulness_heldout": "the circuit's held-out faithfulness",
    "completeness_heldout": "the circuit's held-out completeness",
    "faithfulness_at_smallest": "the smallest faithful circuit's faithfulness (selection half)",
    "graph_circuit.faithfulness": "the attribution graph's faithfulness as a circuit "
    "(selection half)",
    "graph_circuit.faithfulness_heldout": "the attribution graph's held-out faithfulness as a "
    "circuit",
}


def _number(x: Any) -> float | None:
    if x is None or isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _text(x: float) -> str:
    return f"{float(f'{x:.3g}'):g}"


def value_of(summary: dict[str, Any], key: str) -> float | None:
    """A summary number by flag key: `graph_circuit.<metric>` inside graph_circuit,
    `faithfulness_at_smallest` read off the faithfulness curve (selection half) at
    smallest_faithful_size (the curve's keys are ints in memory, strings in summary.json)."""
    if key.startswith("graph_circuit."):
        return _number((summary.get("graph_circuit") or {}).get(key.split(".", 1)[1]))
    if key == "faithfulness_at_smallest":
        n, curve = summary.get("smallest_faithful_size"), summary.get("faithfulness_curve") or {}
        if n is None:
            return None
        return _number(curve.get(n, curve.get(str(n))))
    return _number(summary.get(key))


def random_reaches_circuit(summary: dict[str, Any]) -> dict[str, bool | None]:
    """Per circuit value: whether its random control's mean reaches it (null when either is
    missing, e.g. with no faithful circuit size)."""
    out: dict[str, bool | None] = {}
    for key, control in RANDOM_CONTROLS:
        value, rand = value_of(summary, key), _number(summary.get(control))
        out[key] = None if value is None or rand is None else bool(rand >= value)
    return out


def below_threshold(summary: dict[str, Any]) -> dict[str, bool | None]:
    """Per faithfulness value: whether it is under `faithfulness_threshold` (null when the
    value is missing)."""
    threshold = _number(summary.get("faithfulness_threshold"))
    out: dict[str, bool | None] = {}
    for key in THRESHOLDED:
        value = value_of(summary, key)
        out[key] = None if value is None or threshold is None else bool(value < threshold)
    return out


def flags_of(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One flag per control that reaches its circuit's value and per faithfulness under the
    threshold: `kind` (random_reaches_circuit | below_threshold), `key` (the number flagged),
    `value`, `reference_key` and `reference` (the control's mean or the threshold), `text`."""
    flags = []
    reaches = random_reaches_circuit(summary)
    # At the default size the smallest faithful circuit is the circuit: flagged once.
    same = summary.get("circuit_size") == summary.get("smallest_faithful_size")
    for key, control in RANDOM_CONTROLS:
        if reaches[key] and not (same and key == "faithfulness_at_smallest"):
            value, rand = value_of(summary, key), float(summary[control])
            metric = key.split("_")[0]
            flags.append(
                {
                    "kind": "random_reaches_circuit",
                    "key": key,
                    "value": value,
                    "reference_key": control,
                    "reference": rand,
                    "text": f"random circuits of the same make-up reach {WHAT[key]} "
                    f"({_text(rand)} against {_text(value)}): {metric} does not tell this "
                    "circuit from a random one",
                }
            )
    threshold = _number(summary.get("faithfulness_threshold"))
    for key, under in below_threshold(summary).items():
        if under:
            value = value_of(summary, key)
            flags.append(
                {
                    "kind": "below_threshold",
                    "key": key,
                    "value": value,
                    "reference_key": "faithfulness_threshold",
                    "reference": threshold,
                    "text": f"{WHAT[key]} {_text(value)} is under the faithfulness threshold "
                    f"{_text(threshold)}",
                }
            )
    return flags


def with_flags(summary: dict[str, Any]) -> dict[str, Any]:
    """`summary` with random_reaches_circuit, below_threshold and flags added."""
    return summary | {
        "random_reaches_circuit": random_reaches_circuit(summary),
        "below_threshold": below_threshold(summary),
        "flags": flags_of(summary),
    }


def flags(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's own flags, or computed from it when it predates them."""
    found = summary.get("flags")
    return found if isinstance(found, list) else flags_of(summary)
