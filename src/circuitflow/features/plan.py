"""The features stage's plan (rules features_*, and held_out_tokens before them): which
dictionaries share a job and its forward pass (`groups`), which contexts of the token set the
pass reads (`contexts`), the job's peak memory (`estimate`, which the stage sizes its batches
by) and, for circuitflow.resources (the rule table), its host memory (`job_bytes`) and counted
work (`job_work`).

A job holds the model, every dictionary of its group (fp32) and one `collect.Collector` per
dictionary, whose state is `state.state_bytes(F, k, samples)` whatever the number of tokens:
the streaming top-k merge's memory bound. A batch of the pass runs the model to the group's
deepest layer with every dictionary's hook cached, then encodes one dictionary at a time, so
its working memory is the cached hooks plus the larger of the forward pass's (freed before the
first encode) and one dictionary's: its [B, T, F] features (pre-activations, activations, the
firing mask) and the firing entries' keys. After the pass the windows of every
member are read in one sweep over the contexts they kept (`windows.read_windows_many`, the
model once through the group's depth, `WINDOW_CHUNK` contexts at a time), then each member in
turn gets its logit effects a block of features at a time (`logits.py`) and its tables built
on the host. The sweep also counts the labels' candidate rules for every member
(`label_counts_bytes`, with the group's `position_counts_bytes`), and a last pass over the
held-out contexts (`held_out_contexts`, batched as the pass) counts the chosen ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from circuitflow import dictionary_sources
from circuitflow.capture.plan import TOKENIZE_TOKENS_PER_S, context_length, token_set_contexts
from circuitflow.description import describe
from circuitflow.features.state import (
    CANDIDATES,
    MAX_ATOMS,
    N_BINS,
    QUANTILE_BANDS,
    n_cells,
    state_bytes,
)
from circuitflow.memory import Estimate, estimate_forward, load_bytes, model_dtype_name
from circuitflow.model import architectures
from circuitflow.model.flops import forward_flops_per_token
from circuitflow.perf import Work
from circuitflow.sae.plan import sae_param_bytes
from circuitflow.sae.stream_plan import StreamGroup
from circuitflow.sites import dictionary_sites

RULE = "features"
HELD_OUT_RULE = "held_out_tokens"  # the held-out contexts the labels are scored on
WINDOW_CHUNK = 64  # contexts windows.read_windows reads at a time (its default)
LOGIT_BLOCK = 1024  # features logits.top_logits reads out at a time (its default)
# Per firing (token, feature) entry of a batch: nonzero's three int64 indices, the value, the
# global index, the histogram bin and group, the top and sample keys, the priority, and the
# merge's sorted copies (measured: ~13 int64-wide tensors of nnz alive at once).
BYTES_PER_FIRING = 13 * 8
# Per [B, T, F] element of one dictionary's encode and update, at the larger of the two: the
# encoder's float32 pre-activations and activations; then the activations and the bool firing
# mask (measured on CPU: 215 KB a context of 32 tokens at F = 512, k = 16, against 192 KB here).
BYTES_PER_FEATURE_TOKEN = 4 + 4
# Host bytes of a contexts.parquet row besides its window's tokens (the row's scalars in pandas,
# the window's numpy arrays and list objects) and per window token (id, value, string pointer,
# and the Arrow copy written out).
CONTEXT_ROW_BYTES = 600
CONTEXT_TOKEN_BYTES = 2 * (8 + 4 + 8)
# Host bytes of one kept entry's window between the sweep and its table: two small numpy arrays
# (tokens, values: ~100 bytes of object each plus 17 x 12 bytes of data) and its list slots.
WINDOW_ENTRY_BYTES = 2 * 112 + 17 * 12 + 2 * 8


# --- which dictionaries share a job ---------------------------------------------------------------
class FeatureGroup(StreamGroup):
    """The dictionaries one features job reads: (site, layer) pairs, by layer. Its key, depth
    and parsing are a streaming group's (the same (site, layer) members); only its name
    differs."""

    @property
    def name(self) -> str:
        """Its rule's, log's and benchmark's name: `layer_3`, or `layers_0_to_3`."""
        first, last = self.members[0][1], self.members[-1][1]
        return f"layer_{first}" if first == last else f"layers_{first}_to_{last}"


def members(config: dict) -> list[tuple[str, int]]:
    """Every dictionary's (site, layer), by layer (the SAEs and any transcoders)."""
    return [(site, layer) for layer in config["layers"] for site in dictionary_sites(config)]


def groups(config: dict) -> list[FeatureGroup]:
    """The jobs: `features.layers_per_job` consecutive layers each (every site of a layer in
    the same job), all layers in one when null."""
    layers = list(config["layers"])
    per_job = config["features"]["layers_per_job"] or len(layers)
    sites = dictionary_sites(config)
    out = []
    for at in range(0, len(layers), per_job):
        chunk = layers[at : at + per_job]
        out.append(FeatureGroup(tuple((s, layer) for layer in chunk for s in sites)))
    return out


def group_of(config: dict, job: str | None) -> FeatureGroup:
    """The job's group (its key, as the rule passes it); every dictionary when None."""
    return FeatureGroup.parse(job) if job else FeatureGroup(tuple(members(config)))


# --- which contexts -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Contexts:
    """The contexts the pass reads, rows of the token set in the order fed: the ones the
    dictionaries were not trained on first (`held_out`), then training ones."""

    rows: tuple[int, ...]
    held_out: int  # how many of `rows` (the first ones) no dictionary was trained on

    @property
    def trained_on(self) -> int:
        return len(self.rows) - self.held_out


CONTEXTS_NOTE = {
    "capture": "every context read is one the dictionaries were trained on (train_sae reads "
    "every captured row; the token set holds no other)",
    "stream": "the token set's held-out evaluation contexts first (not trained on), then "
    "training contexts",
    "pretrained": "published dictionaries: none of the run's contexts were trained on",
}


def held_out_rows(source: str, n_contexts: int, meta_held_out: int) -> range:
    """Rows of the token set the dictionaries were not trained on: for `sae.source` stream the
    held-out evaluation contexts at its end (the token set's `held_out_contexts`); for
    pretrained, every row (published dictionaries were trained elsewhere); for capture none
    (train_sae reads every captured row)."""
    if source == "pretrained":
        return range(n_contexts)
    if source == "stream":
        return range(n_contexts - meta_held_out, n_contexts)
    return range(0)


def contexts(source: str, n_contexts: int, meta_held_out: int, wanted: int) -> Contexts:
    """The first `wanted` contexts (at most the token set's): held-out rows, then the rest in
    the token set's order."""
    held = held_out_rows(source, n_contexts, meta_held_out)
    rest = [r for r in range(n_contexts) if r not in held]
    rows = (list(held) + rest)[: min(wanted, n_contexts)]
    return Contexts(tuple(rows), min(len(held), len(rows)))


def per_context(config: dict, model_cfg) -> tuple[int, int]:
    """(context length, tokens counted a context: BOS left out when capture.exclude_bos)."""
    t = context_length(config, model_cfg)
    return t, t - int(config["capture"]["exclude_bos"])


def wanted_contexts(config: dict, model_cfg) -> int:
    """Contexts the pass reads: `features.n_tokens` counted tokens, whole contexts, at most the
    token set's."""
    _, counted = per_context(config, model_cfg)
    wanted = math.ceil(config["features"]["n_tokens"] / counted)
    return min(wanted, token_set_contexts(config))


# --- memory ---------------------------------------------------------------------------------------
def dictionary_width(config: dict, d_model: int, group: FeatureGroup) -> int:
    """The widest d_sae of the group, each dictionary at its real width (the run's
    description: a published one's cfg.json, else the configured expansion)."""
    return describe(config).widest(group.members)


def firing_per_token(
    config: dict, d_sae: int, group: FeatureGroup | None = None, active: int | None = None
) -> int:
    """Features firing a token, planned: the TopK's k, else the L0 the controller steers to;
    where a run has published dictionaries, the most any of `group`'s members (every
    dictionary when None) has active as the description plans it (a published one's own k,
    or twice the L0 its release lists), at most the width. A features job, whose config holds
    its own sections only, passes `active` from the dictionaries it loaded (None: a tenth of
    the width, for dictionaries that state no k)."""
    sae = config["sae"]
    if any(not s.trains for s in dictionary_sources.used(config)):
        if active is None and "sites" in config:
            run = describe(config)
            chosen = (
                run.dictionaries if group is None else [run.dictionary(*m) for m in group.members]
            )
            active = max((d.active for d in chosen), default=None)
        return max(1, min(d_sae, active if active else d_sae // 10))
    return min(
        d_sae, sae["k"] if sae["architecture"] in ("topk", "batchtopk") else sae["target_l0"]
    )


def kept_rows(n_features: int, k: int, samples: int) -> int:
    """Rows of contexts.parquet at most: k top and `samples` per quantile band per feature."""
    return n_features * (k + (len(QUANTILE_BANDS) - 1) * samples)


def readout_host_bytes(config: dict, n_features: int, n_members: int, t: int, vocab: int) -> int:
    """Host bytes of the read-out after the pass: every member's result (its collector's state
    copied to the host) and windows (read for all members in one sweep, held until each
    member's tables are written), a window chunk's features of one member, a block of logit
    effects, and one member's tables (contexts rows with their windows) at a time."""
    f = config["features"]
    window = sum(f["window"]) + 1
    rows = kept_rows(n_features, f["k"], f["samples"])
    per_member = state_bytes(n_features, f["k"], f["samples"]) + rows * WINDOW_ENTRY_BYTES
    chunk = WINDOW_CHUNK * t * n_features * 4
    logits = LOGIT_BLOCK * vocab * 4 * 3
    table = rows * (CONTEXT_ROW_BYTES + window * CONTEXT_TOKEN_BYTES)
    return n_members * per_member + chunk + logits + table + n_features * (N_BINS * 8 + 720)


def label_counts_bytes(config: dict, n_features: int, vocab: int, t: int) -> int:
    """One member's label counts (scores.AtomCounts), the rules' choice and their scoring
    alive together at most: per cell (rules.n_cells) an int32 count per slot (the candidates:
    CANDIDATES tokens of each of 3 kinds a feature; the scored: the two labellers' and their
    controls' tokens, 4 x MAX_ATOMS a feature) and an int64 count per feature, each twice."""
    cells = n_cells(t)
    slots = (3 * CANDIDATES + 4 * MAX_ATOMS) * n_features
    return cells * (4 * slots + 8 * 2 * n_features)


def position_counts_bytes(vocab: int, t: int) -> int:
    """The group's scores.PositionCounts, the labels' and the held-out positions': int64 per
    cell for each (kind, token)."""
    return 2 * n_cells(t) * 8 * 3 * (vocab + 1)


def estimate(
    config: dict,
    group: FeatureGroup,
    device: str,
    d_sae: int | None = None,
    active: int | None = None,
) -> Estimate:
    """The job's peak memory as a function of its batch (contexts of the pass): the model and
    the group's dictionaries, every collector's state (`state.state_bytes`), the forward
    pass with every member's hook cached (float32), and one dictionary's encode and update;
    the read-out after the pass as its own phase. On a GPU the read-out's tables are host
    memory (`buffers`), with the token set's pages. `d_sae`: the widest member's, where the
    job has read it from the dictionaries (its config section is not the whole run's)."""
    cfg = architectures.model_cfg(config)
    f = config["features"]
    t, _ = per_context(config, cfg)
    d_sae = d_sae or dictionary_width(config, cfg.d_model, group)
    n = len(group.members)
    dtype = model_dtype_name(config, device)
    fwd = estimate_forward(
        cfg, architectures.n_params(cfg), t, group.depth, n, dtype, "float32", device
    )
    dictionaries = n * sae_param_bytes(cfg.d_model, d_sae)
    collectors = n * state_bytes(d_sae, f["k"], f["samples"])
    firing = firing_per_token(config, d_sae, group, active)
    encode = t * (d_sae * BYTES_PER_FEATURE_TOKEN + firing * BYTES_PER_FIRING)
    cached = n * t * cfg.d_model * 4  # run_with_cache keeps every member's hook on the device
    tokens = 4 * token_set_contexts(config) * t
    readout = readout_host_bytes(config, d_sae, n, t, cfg.d_vocab)
    cuda = device.startswith("cuda")
    # The sweep also counts every member's labels on each chunk it reads (the firing entries),
    # into counts on the device (labels); one member's go to the host as it is written.
    counting = WINDOW_CHUNK * t * firing * BYTES_PER_FIRING
    one = label_counts_bytes(config, d_sae, cfg.d_vocab, t)
    # The held-out pass keeps every member's firing entries (position, feature: int64, and the
    # activation) for the examples, copied to the host once at its end.
    entries = n * held_out_contexts(config, cfg) * t * firing * 20
    labels = n * one + position_counts_bytes(cfg.d_vocab, t) + entries
    device_readout = (
        WINDOW_CHUNK * t * d_sae * 4 * 2 + LOGIT_BLOCK * cfg.d_vocab * 4 * 3 + counting + labels
    )
    readout += one + (counting + labels if not cuda else 0)
    weights = fwd.weights + dictionaries
    return Estimate(
        weights=weights,
        # The forward's working memory is freed before the first encode.
        per_context_device=cached + max(fwd.per_context_device, encode),
        per_context_host=0,
        buffers=tokens + (readout if cuda else 0),
        device=device,
        fixed_device=fwd.fixed_device + collectors,
        # The read-out: one dictionary at a time, the collectors still alive.
        other_phases=(weights + collectors + (device_readout if cuda else readout + tokens),),
        item="context",
    )


def planned_batch(config: dict) -> int:
    """Contexts a batch is planned at before the job runs: `features.batch_contexts`, else
    `capture.max_batch_size` (the most the job may plan), at most the contexts read."""
    cfg = architectures.model_cfg(config)
    most = config["features"]["batch_contexts"] or config["capture"]["max_batch_size"]
    return max(1, min(most, wanted_contexts(config, cfg)))


# --- the rule table's plan ------------------------------------------------------------------------
def held_out_contexts(config: dict, model_cfg) -> int:
    """Contexts of held_out_tokens's set: `features.held_out_tokens` counted tokens, whole
    contexts (features/held_out.py)."""
    _, counted = per_context(config, model_cfg)
    return math.ceil(config["features"]["held_out_tokens"] / counted)


def held_out_tokenized(config: dict, model_cfg) -> int:
    """Tokens held_out_tokens makes: a text corpus is packed again up to the token set's end
    before its own contexts; the embedded language draws its own only."""
    t, _ = per_context(config, model_cfg)
    before = token_set_contexts(config) if config["capture"]["corpus"] else 0
    return (before + held_out_contexts(config, model_cfg)) * t


def job_bytes(config: dict, rule: str, device: str, job: str | None = None) -> int:
    """Host bytes of a features job's work (`job`: its group's key): on the CPU its whole
    peak (`estimate`), on a GPU the token set's pages and the read-out's tables; a real
    model's load where that is more. held_out_tokens: the packed stream and its contexts
    (int32, with the tokenizer's int64 ids of a batch of documents: 16 bytes a token)."""
    cfg = architectures.model_cfg(config)
    if rule == HELD_OUT_RULE:
        return 16 * held_out_tokenized(config, cfg)
    host = estimate(config, group_of(config, job), device).host_peak(planned_batch(config))
    real = config["model"]["name"] != "embedded"
    return max(load_bytes(architectures.n_params(cfg)) if real else 0, host)


def encode_flops_per_token(d_model: int, d_sae: int) -> float:
    """An encoder's matmul (2 d F) and the collector's pass over the [T, F] features (a
    comparison and a scan per element, counted as 2 FLOPs)."""
    return 2.0 * d_model * d_sae + 2.0 * d_sae


def sweep_contexts(config: dict, group: FeatureGroup, d_sae: int, n_contexts: int) -> int:
    """Contexts the windows' sweep reads again at most: the union of what the members kept
    (`kept_rows` each), at most every context read."""
    f = config["features"]
    return min(n_contexts, len(group.members) * kept_rows(d_sae, f["k"], f["samples"]))


def job_work(config: dict, rule: str, job: str | None = None) -> Work:
    """The pass (every context read through the group's deepest layer, in the model's dtype;
    each dictionary's encoder and collector in float32), the windows' sweep (at most every
    context again, through the deepest layer once for the group, each member's encoder on it:
    `sweep_contexts`), the held-out pass the labels are scored on (`held_out_contexts`, the
    same per context) and each member's logit effects (d_model x vocabulary per feature); the
    token set read. held_out_tokens: tokenising (or drawing) its tokens."""
    cfg = architectures.model_cfg(config)
    if rule == HELD_OUT_RULE:
        return Work({}, other_seconds=held_out_tokenized(config, cfg) / TOKENIZE_TOKENS_PER_S)
    group = group_of(config, job)
    t, _ = per_context(config, cfg)
    n_contexts = wanted_contexts(config, cfg)
    d_sae = dictionary_width(config, cfg.d_model, group)
    tokens = n_contexts * t
    forward = tokens * forward_flops_per_token(cfg, t, group.depth, unembed=False)
    encode = len(group.members) * tokens * encode_flops_per_token(cfg.d_model, d_sae)
    reread = (sweep_contexts(config, group, d_sae, n_contexts) + held_out_contexts(config, cfg)) * t
    forward += reread * forward_flops_per_token(cfg, t, group.depth, unembed=False)
    encode += len(group.members) * reread * encode_flops_per_token(cfg.d_model, d_sae)
    logits = len(group.members) * 2.0 * d_sae * cfg.d_model * cfg.d_vocab
    dtype = model_dtype_name(config, "cuda")
    flops = {"float32": encode + logits}
    flops[dtype] = flops.get(dtype, 0.0) + forward
    return Work(flops, disk_bytes=4 * (n_contexts + held_out_contexts(config, cfg)) * t)


def forward_equivalents_per_token(config: dict, job: str | None = None) -> float:
    """Forward-pass equivalents of a job per context read, as its summaries count them (summed
    over its members): the pass, the windows' sweep and the held-out pass, each through the
    group's depth."""
    cfg = architectures.model_cfg(config)
    group = group_of(config, job)
    n_contexts = wanted_contexts(config, cfg)
    d_sae = dictionary_width(config, cfg.d_model, group)
    sweep = sweep_contexts(config, group, d_sae, n_contexts) / max(n_contexts, 1)
    held = held_out_contexts(config, cfg) / max(n_contexts, 1)
    return (1 + sweep + held) * group.depth / cfg.n_layers
