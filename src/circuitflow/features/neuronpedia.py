"""The feature batches SAEDashboard's Neuronpedia runner writes, from one dictionary's feature
files (`write.py`), so Neuronpedia's own utilities can convert them for upload.

The format was read from SAEDashboard's repository (github.com/jbloomAus/SAEDashboard, version
0.8.0, commit db4839a41116d729fc9f43c1878e7b8b157748ea of 2026-05-11):
`sae_dashboard/neuronpedia/neuronpedia_runner.py` (what it writes), `neuronpedia_dashboard.py`
(the batch, feature and activation records and their `to_dict`) and `neuronpedia_converter.py`
(how each field is filled). No code is taken from it; this writes the same files:

`{out}/{model_id}_{sae_set}_{hook_name}_{d_sae}/` (the runner's output folder name) holds

- `run_settings.json`: the settings of the run (ours: model, set, hook, token counts, ...);
- `skipped_indexes.json`: `model_id`, `layer` (a string), `sae_set`, `log_sparsity`,
  `skipped_indexes` (the features left out; that version writes every feature, so none);
- `batch-{n}.json`, n = 0, 1, ...: `n_features_per_batch` features each, in index order, an
  object with `model_id`, `layer`, `sae_set`, `sae_id_suffix` and `features`, a list of:

  - `feature_index`: the feature;
  - `neg_str`, `neg_values`; `pos_str`, `pos_values`: suppressed and promoted tokens (their
    strings) and logit effects;
  - `frac_nonzero`: density;
  - `freq_hist_data_bar_values`, `freq_hist_data_bar_heights`: the activation histogram's
    non-empty bins, their centres (geometric) and counts;
  - `logits_hist_data_bar_values`, `logits_hist_data_bar_heights`: the histogram of the logit
    effects over the vocabulary, bin centres and counts;
  - `n_prompts_total`, `n_tokens_in_prompt`, `dataset`: contexts read, their length, the token
    set's name;
  - `activations`: a list of `bin_min`, `bin_max`, `bin_contains`, `tokens` (strings),
    `values`, `qualifying_token_index`; first the top contexts, with `bin_min` -1, `bin_max` the
    feature's maximum and `bin_contains` -1 (as the runner marks its top group), then each
    quantile band's samples, the highest band first as the runner writes its intervals
    (`sequence_data_generator.py`, its loop from the last interval down), with the band's range
    and its share of the firing tokens. The runner's intervals are equal slices of [0, max]
    and `bin_contains` the share of all tokens (zeros too) in one; ours are activation
    quantiles of the firing tokens, their share of those (docs/outputs.md);
  - `neuron_alignment_*`, `correlated_neurons_*`, `correlated_features_*`,
    `decoder_weights_dist`, `vector`: empty lists (not computed here).

Floats are rounded to 5 decimals, as the runner rounds them. Neuronpedia names a feature
`MODEL@SAE:INDEX` (`feature_id`); its SAE id is `{layer}-{sae_set}` with the suffix after
`__` where there is one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from circuitflow.io import atomic_dir, write_json, write_text

__all__ = [
    "ACTIVATION_FIELDS",
    "export_run",
    "FEATURE_FIELDS",
    "Target",
    "feature_id",
    "sae_id",
    "write_batches",
]

SAE_SET = "circuitflow-{site}"  # the default SAE set name of a run's dictionaries at a site

FEATURE_FIELDS = (
    "feature_index",
    "neuron_alignment_indices",
    "neuron_alignment_values",
    "neuron_alignment_l1",
    "correlated_neurons_indices",
    "correlated_neurons_l1",
    "correlated_neurons_pearson",
    "correlated_features_indices",
    "correlated_features_l1",
    "correlated_features_pearson",
    "neg_str",
    "neg_values",
    "pos_str",
    "pos_values",
    "frac_nonzero",
    "freq_hist_data_bar_values",
    "freq_hist_data_bar_heights",
    "logits_hist_data_bar_heights",
    "logits_hist_data_bar_values",
    "n_prompts_total",
    "n_tokens_in_prompt",
    "dataset",
    "decoder_weights_dist",
    "activations",
    "vector",
)
ACTIVATION_FIELDS = (
    "bin_min",
    "bin_max",
    "bin_contains",
    "tokens",
    "values",
    "qualifying_token_index",
)
_EMPTY_LISTS = [f for f in FEATURE_FIELDS if f.startswith(("neuron_", "correlated_"))] + [
    "decoder_weights_dist",
    "vector",
]


def sae_id(layer: int, sae_set: str, suffix: str | None = None) -> str:
    return f"{layer}-{sae_set}" + (f"__{suffix}" if suffix else "")


def feature_id(
    model_id: str, layer: int, sae_set: str, index: int, suffix: str | None = None
) -> str:
    """Neuronpedia's name of a feature: `MODEL@SAE:INDEX`."""
    return f"{model_id}@{sae_id(layer, sae_set, suffix)}:{index}"


def _r(values) -> list[float]:
    return np.round(np.asarray(values, dtype=np.float64), 5).tolist()


def band_order(band: pd.Series) -> pd.Series:
    """Where a context's group goes in a feature's `activations`, as SAEDashboard writes them:
    the top activations first, then the quantile bands from the highest down (its intervals
    run from the highest to the lowest)."""
    return (-band).where(band >= 0, -(2**31))


def _activations(g: pd.DataFrame, max_activation: float) -> list[dict[str, Any]]:
    out = []
    for row in g.itertuples(index=False):
        top = row.kind == "top"
        out.append(
            {
                "bin_min": -1 if top else round(float(row.band_lo), 5),
                "bin_max": round(float(max_activation), 5) if top else round(float(row.band_hi), 5),
                "bin_contains": -1 if top else round(float(row.band_share), 5),
                "tokens": list(row.token_str),
                "values": _r(row.values),
                "qualifying_token_index": int(row.qualifying_index),
            }
        )
    return out


def _feature(row, contexts: pd.DataFrame | None, edges: np.ndarray, meta: dict) -> dict[str, Any]:
    hist = np.asarray(row.hist)
    centres = np.sqrt(edges[:-1] * edges[1:])
    centres[0], centres[-1] = edges[1] / 2, edges[-2]  # the open-ended first and last bins
    nz = hist > 0
    lo, hi = float(row.logit_hist_lo), float(row.logit_hist_hi)
    lh = np.asarray(row.logit_hist)
    lcentres = lo + (np.arange(len(lh)) + 0.5) * (hi - lo) / len(lh)
    feat = {
        "feature_index": int(row.feature),
        "neg_str": list(row.suppressed_str),
        "neg_values": _r(row.suppressed_values),
        "pos_str": list(row.promoted_str),
        "pos_values": _r(row.promoted_values),
        "frac_nonzero": round(float(row.density), 8),
        "freq_hist_data_bar_values": _r(centres[nz]),
        "freq_hist_data_bar_heights": [int(h) for h in hist[nz]],
        "logits_hist_data_bar_heights": [int(h) for h in lh],
        "logits_hist_data_bar_values": _r(lcentres),
        "n_prompts_total": int(meta["n_contexts"]),
        "n_tokens_in_prompt": int(meta["context_length"]),
        "dataset": meta.get("dataset", ""),
        "activations": [] if contexts is None else _activations(contexts, row.max_activation),
    }
    feat.update({name: [] for name in _EMPTY_LISTS})
    return {name: feat[name] for name in FEATURE_FIELDS}


@dataclass(frozen=True)
class Target:
    """Where the batches go on Neuronpedia: the model's id there, the layer, the SAE set, the
    hook the dictionary reads, an optional SAE id suffix, and the token set's name."""

    model_id: str
    layer: int
    sae_set: str
    hook_name: str
    sae_id_suffix: str | None = None
    dataset: str = ""

    def folder_name(self, n_features: int) -> str:
        """The runner's output folder: `{model_id}_{sae_set}_{hook_name}_{d_sae}[_{suffix}]`."""
        name = f"{self.model_id}_{self.sae_set}_{self.hook_name}_{n_features}"
        return name + (f"_{self.sae_id_suffix}" if self.sae_id_suffix else "")

    def feature_id(self, index: int) -> str:
        return feature_id(self.model_id, self.layer, self.sae_set, index, self.sae_id_suffix)


def write_batches(
    out: Path | str,
    features: pd.DataFrame,
    contexts: pd.DataFrame,
    summary: dict[str, Any],
    target: Target,
    n_features_per_batch: int = 128,
) -> Path:
    """Write the runner's folder under `out` from `write.py`'s tables (all three files of one
    dictionary); the folder is replaced as a whole once complete. Returns it."""
    folder = Path(out) / target.folder_name(len(features))
    meta = {**summary, "dataset": target.dataset}
    edges = np.asarray([np.inf if e is None else e for e in summary["hist_edges"]])
    head = {
        "model_id": target.model_id,
        "layer": target.layer,
        "sae_set": target.sae_set,
        "sae_id_suffix": target.sae_id_suffix,
    }
    order = contexts.assign(_order=band_order(contexts["band"]))
    order = order.sort_values(["feature", "_order", "rank"], kind="stable").drop(columns="_order")
    by_feature = dict(tuple(order.groupby("feature", sort=False)))
    rows = list(features.sort_values("feature").itertuples(index=False))
    with atomic_dir(folder) as tmp:
        write_json(
            tmp / "run_settings.json",
            {
                **head,
                "hook_name": target.hook_name,
                "n_prompts_total": summary["n_contexts"],
                "n_tokens_in_prompt": summary["context_length"],
                "n_features_at_a_time": n_features_per_batch,
                "huggingface_dataset_path": target.dataset,
                "written_by": "circuitflow.features.neuronpedia",
            },
        )
        write_json(
            tmp / "skipped_indexes.json",
            {
                "model_id": target.model_id,
                "layer": str(target.layer),
                "sae_set": target.sae_set,
                "log_sparsity": -6,
                "skipped_indexes": [],
            },
        )
        for b, s in enumerate(range(0, len(rows), n_features_per_batch)):
            batch = [
                _feature(r, by_feature.get(r.feature), edges, meta)
                for r in rows[s : s + n_features_per_batch]
            ]
            # One line, as the runner writes them; every number is finite by construction, and
            # allow_nan=False makes a NaN an error rather than a file Neuronpedia refuses.
            text = json.dumps({**head, "features": batch}, allow_nan=False)
            write_text(tmp / f"batch-{b}.json", text)
    return folder


def export_run(
    results: Path | str,
    out: Path | str,
    model_id: str,
    sae_set: str = SAE_SET,
    n_features_per_batch: int = 128,
) -> list[Path]:
    """Write the batches of every dictionary whose feature files a run holds
    (`results/features/{site}/layer_{layer}/`) under `out`, one runner folder each; `sae_set`
    may name the site (`{site}`). Returns the folders, by site and layer."""
    from circuitflow.errors import InputError
    from circuitflow.inputs import json_file

    folders = sorted(Path(results, "features").glob("*/layer_*"))
    if not folders:
        raise InputError(
            f"{Path(results) / 'features'}: no feature folders; run the features rules"
        )
    written = []
    for folder in folders:
        summary = json_file(folder / "summary.json", ("site", "layer", "hook"), "features",
                            "feature summary")  # fmt: skip
        site, layer = summary["site"], int(summary["layer"])
        target = Target(model_id, layer, sae_set.format(site=site), summary["hook"],
                        dataset=Path(summary.get("token_set", "")).name)  # fmt: skip
        features = pd.read_parquet(folder / "features.parquet")
        contexts = pd.read_parquet(folder / "contexts.parquet")
        written.append(
            write_batches(out, features, contexts, summary, target, n_features_per_batch)
        )
    return written
