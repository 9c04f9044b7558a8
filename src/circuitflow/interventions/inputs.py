"""What the interventions stage reads of the attribution stage's outputs: its tables (heads,
components, features) and graph.json, each checked (circuitflow.inputs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from circuitflow import inputs


@dataclass
class AttributionResults:
    """What the attribution stage wrote for the behaviour (None where a file is absent)."""

    heads: pd.DataFrame | None
    components: pd.DataFrame | None
    features: pd.DataFrame | None
    graph: dict[str, Any] | None


# What interventions read from each attribution output (the score column is the method's).
ATTRIBUTION_TABLES = {
    "heads": ("layer", "head", "score"),
    "components": ("kind", "layer", "index", "score", "score_selection"),
    "features": ("kind", "site", "layer", "feature", "score", "score_selection"),
}


def read_attribution(attr_dir: Path | str, required: bool = False) -> AttributionResults:
    """The attribution stage's tables and graph.json in `attr_dir`, each checked (InputError
    naming the file when unreadable or missing a column). An absent file reads as None unless
    `required` (the stage: the rule names all four)."""
    attr_dir = Path(attr_dir)
    rerun = f"attribution for {attr_dir}"

    def table(name: str) -> pd.DataFrame | None:
        path = attr_dir / f"{name}.parquet"
        if not required and not path.exists():
            return None
        return inputs.parquet_table(
            path, ATTRIBUTION_TABLES[name], rerun, what=f"attribution {name} table"
        )

    graph_path = attr_dir / "graph.json"
    graph = (
        inputs.json_file(graph_path, ("nodes",), rerun, what="attribution graph")
        if required or graph_path.exists()
        else None
    )
    return AttributionResults(table("heads"), table("components"), table("features"), graph)
