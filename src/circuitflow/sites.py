"""Which sites a run's dictionaries sit at, read from a resolved config (`sites`, `sae.kind`):
the SAEs attribution splices, every dictionary's site, each one's kind and what capture writes.
A floor module: the planners (`memory`, each stage's `plan.py`), the config checks and the
workflow all ask here, and it imports nothing of circuitflow's."""

from __future__ import annotations


def trains_transcoders(config: dict) -> bool:
    """sae.kind transcoder or both: a transcoder per layer, from mlp_in to mlp_out."""
    return config["sae"]["kind"] in ("transcoder", "both")


def sae_sites(config: dict) -> list[str]:
    """The sites whose SAEs attribution and interventions splice: `sites`, none for a run of
    transcoders alone (sae.kind transcoder)."""
    return [] if config["sae"]["kind"] == "transcoder" else list(config["sites"])


def dictionary_sites(config: dict) -> list[str]:
    """The sites dictionaries are trained (or loaded) at: `sites`, and with sae.kind both the
    transcoders' too (saved under saes/mlp_out/)."""
    extra = ["mlp_out"] if config["sae"]["kind"] == "both" else []
    return [*config["sites"], *extra]


def dictionary_kind(config: dict, site: str) -> str:
    """What the dictionary at `site` is: `transcoder` at mlp_out when the run trains
    transcoders, else `sae`."""
    return "transcoder" if trains_transcoders(config) and site == "mlp_out" else "sae"


def capture_sites(config: dict) -> list[str]:
    """The sites capture writes: the dictionaries' (dictionary_sites), and for transcoders
    their input, mlp_in, too (one forward pass writes every site)."""
    extra = ["mlp_in"] if trains_transcoders(config) else []
    return [*extra, *(s for s in dictionary_sites(config) if s not in extra)]
