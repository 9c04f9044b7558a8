"""The features stage (rules features_*): one streamed pass of the model over `features.n_tokens`
tokens of the run's token set feeds a `collect.Collector` per dictionary of the job's group
(SAEs and transcoders, trained or published: each read at the hook its cfg.json names), then
each dictionary is read out (windows, logit effects, labels: `write.build`) into
`features/{site}/layer_{layer}/` (`write.write`; docs/outputs.md).

Contexts the dictionaries were not trained on are fed first (`plan.contexts`); summary.json
records how many of each were read (`contexts_held_out`, `contexts_trained_on`) and which token
set rows (`context` in contexts.parquet is a row of activations/tokens.npy).

Resumable like capture: every `features.checkpoint_tokens` tokens, and on SIGTERM, the
collectors' state and the contexts fed so far are saved to the checkpoint directory; a rerun
with the same inputs and settings (the checkpoint's key) continues from there. The pass feeds
the contexts in a fixed order and the collector's result does not depend on how it was
batched, so a resumed job writes the same files as an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow import dictionary_sources, memory
from circuitflow.features import plan as fplan
from circuitflow.features import write
from circuitflow.features.collect import Collector
from circuitflow.features.config import FeaturesConfig
from circuitflow.features.held_out import examples as held_out_examples
from circuitflow.features.labels import LABELLERS, label_columns, texts, token_rules
from circuitflow.features.logits import top_logits
from circuitflow.features.rules import KINDS, condition_names, position_keys
from circuitflow.features.scores import (
    AtomCounts,
    PositionCounts,
    Slots,
    choose,
    control_order,
    score,
)
from circuitflow.features.state import CANDIDATES
from circuitflow.features.windows import read_windows_many
from circuitflow.io import atomic_path, sha256_file
from circuitflow.perf import PassCounter
from circuitflow.resumable import Interrupted, sigterm_flag

log = logging.getLogger(__name__)

CHECKPOINT = "state.pt"


@dataclass
class Member:
    """One dictionary of the job: where it is saved and written, what it reads, its collector."""

    site: str
    layer: int
    sae: Any
    sae_dir: Path
    out: Path
    collector: Collector

    @property
    def hook(self) -> str:
        """What the dictionary reads (a transcoder: the MLP's input)."""
        return self.sae.cfg.metadata.hook_name

    @property
    def kind(self) -> str:
        from circuitflow.sae.transcoder import is_transcoder

        return "transcoder" if is_transcoder(self.sae) else "sae"


def encode(sae: Any, acts: torch.Tensor) -> torch.Tensor:
    """A dictionary's feature activations [..., F] (float32) of its hook's activations."""
    return sae.encode(acts.to(sae.W_enc.dtype)).float()


def vocabulary(tokenizer, d_vocab: int) -> list[str]:
    """Each token id's text (its id as text where the model has no tokenizer)."""
    if tokenizer is None:
        return [str(i) for i in range(d_vocab)]
    return tokenizer.batch_decode([[i] for i in range(d_vocab)])


# --- the pass -------------------------------------------------------------------------------------
def checkpoint_key(members: list[Member], token_meta: dict, rows: tuple[int, ...], opts, seed):
    """What a checkpoint must match to be resumed: the model, token set, contexts in order,
    dictionaries' weights and the collectors' settings."""
    return json.dumps(
        {
            "model_hash": token_meta.get("model_hash"),
            "token_set_hash": token_meta.get("token_set_hash"),
            "rows": [len(rows), rows[0] if rows else -1, rows[-1] if rows else -1],
            "dictionaries": [sha256_file(m.sae_dir / "sae_weights.safetensors") for m in members],
            "k": opts.k,
            "samples": opts.samples,
            "seed": seed,
            "dense_threshold": opts.dense_threshold,
        },
        sort_keys=True,
    )


def load_checkpoint(path: Path, key: str, members: list[Member]) -> int:
    """Contexts already fed according to the checkpoint at `path` (0 without a usable one),
    after loading its collectors' state."""
    if not path.exists():
        return 0
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - a kill mid-write, a full disk: any damage
        log.warning("checkpoint %s is unreadable (%s): starting afresh", path, err)
        return 0
    if not isinstance(state, dict) or state.get("key") != key:
        log.info("checkpoint %s was made with other inputs or settings: starting afresh", path)
        return 0
    for m, s in zip(members, state["collectors"], strict=True):
        m.collector.load_state_dict(s)
    return int(state["fed"])


def save_checkpoint(path: Path, key: str, members: list[Member], fed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"key": key, "fed": fed, "collectors": [m.collector.state_dict() for m in members]}
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def feed(
    model,
    members: list[Member],
    tokens: np.ndarray,
    rows: tuple[int, ...],
    batch: int,
    fed: int,
    checkpoint: tuple[Path, str, int] | None,
    counter: PassCounter,
    progress: bool = True,
) -> int:
    """Run the model over token set `rows[fed:]`, `batch` contexts at a time (halved on CUDA
    out-of-memory), through the deepest member's layer with every member's hook cached, and
    update each member's collector. `checkpoint` = (path, key, contexts between saves): saved
    then and on SIGTERM (which raises Interrupted once saved). Returns the contexts fed."""
    from tqdm import tqdm

    device = next(model.parameters()).device
    hooks = sorted({m.hook for m in members})
    depth = max(m.layer for m in members) + 1
    t = int(tokens.shape[1])
    backoff = memory.OOMBackoff(batch, str(device), stage="features")
    last_saved = fed

    def run(a: int, b: int) -> int:
        ids = torch.from_numpy(np.asarray(tokens[list(rows[a:b])], dtype=np.int64)).to(device)
        with torch.inference_mode():
            _, cache = model.run_with_cache(ids, names_filter=hooks, stop_at_layer=depth)
            for m in members:
                m.collector.update(ids, encode(m.sae, cache[m.hook]))
        counter.forward(b - a, depth / model.cfg.n_layers)
        return b

    def save() -> None:
        if checkpoint is not None:
            save_checkpoint(checkpoint[0], checkpoint[1], members, fed)

    every = 1 if os.isatty(2) else 10
    bar = tqdm(total=len(rows) * t, initial=fed * t, unit="tok", unit_scale=True,
               disable=not progress, mininterval=every, desc="features")  # fmt: skip
    with sigterm_flag() as stop, bar:
        while fed < len(rows):
            if stop.requested:
                save()
                raise Interrupted(f"SIGTERM: progress saved at context {fed} of {len(rows)}")
            a = fed
            fed = backoff.run(lambda bs, a=a: run(a, min(a + bs, len(rows))))
            bar.update((fed - a) * t)
            if fed - last_saved >= (checkpoint[2] if checkpoint else len(rows)) or fed == len(rows):
                save()  # the last one too: a job killed while reading out skips the pass
                last_saved = fed
    return fed


# --- read-out -------------------------------------------------------------------------------------
def group_reader(model, members: list[Member], tokens: np.ndarray, rows: tuple[int, ...], counter,
                 counts: list | None = None, first: int = 0):  # fmt: skip
    """`windows.read_windows_many`'s reader for the group: token ids of contexts given by feed
    index (rows of the pass), the model run once through the deepest member's layer with every
    member's hook cached, and each member's features on demand. `counts`: each member's
    scores.AtomCounts, which every context read also feeds (the positions the `rules`
    labeller chooses its rules on)."""
    device = next(model.parameters()).device
    order = np.asarray(rows, dtype=np.int64)
    hooks = sorted({m.hook for m in members})
    depth = max(m.layer for m in members) + 1

    def read(fed_ids: np.ndarray):
        ids = torch.from_numpy(np.asarray(tokens[order[fed_ids]], dtype=np.int64)).to(device)
        with torch.inference_mode():
            _, cache = model.run_with_cache(ids, names_filter=hooks, stop_at_layer=depth)
            keys = position_keys(ids, first) if counts is not None else None
            if keys is not None:
                counts[0].where.update(*keys)  # one PositionCounts for the group
        counter.forward(len(ids), depth / model.cfg.n_layers)

        def acts_of(i: int) -> torch.Tensor:
            with torch.inference_mode():
                acts = encode(members[i].sae, cache[members[i].hook])
                if keys is not None:
                    counts[i].update(*keys, acts[:, first:].reshape(-1, acts.shape[-1]))
                return acts.cpu()

        return ids.cpu(), acts_of

    return read


def count_positions(members: list[Member], cache, ids: torch.Tensor, counts: list,
                    first: int, entries: list | None = None, offset: int = 0) -> None:  # fmt: skip
    """Feed every member's counts (and their shared PositionCounts) the positions of contexts
    `ids` (from `first` on); `entries`: per member a list that gets the firing entries
    (position counted from `offset`, feature, activation) on the host."""
    keys, cells = position_keys(ids, first)
    counts[0].where.update(keys, cells)
    for i, (m, c) in enumerate(zip(members, counts, strict=True)):
        acts = encode(m.sae, cache[m.hook])[:, first:]
        acts = acts.reshape(-1, acts.shape[-1])
        pos, feat = c.update(keys, cells, acts)
        if entries is not None:  # kept on the device: one copy to the host at the end
            entries[i].append((pos + offset, feat, acts[pos, feat]))


def score_pass(model, members: list[Member], held: np.ndarray, batch: int, first: int,
               counts: list, counter: PassCounter) -> list[tuple[np.ndarray, ...]]:  # fmt: skip
    """Run the model over the held-out contexts `held`, `batch` at a time (halved on CUDA
    out-of-memory), and feed every member's counts (the labels' scores). Returns each
    member's firing entries (position counted over the held-out contexts, feature,
    activation)."""
    device = next(model.parameters()).device
    hooks = sorted({m.hook for m in members})
    depth = max(m.layer for m in members) + 1
    backoff = memory.OOMBackoff(batch, str(device), stage="features")
    per = held.shape[1] - first
    entries: list[list] = [[] for _ in members]

    def run(a: int, b: int) -> int:
        ids = torch.from_numpy(np.asarray(held[a:b], dtype=np.int64)).to(device)
        with torch.inference_mode():
            _, cache = model.run_with_cache(ids, names_filter=hooks, stop_at_layer=depth)
            count_positions(members, cache, ids, counts, first, entries, a * per)
        counter.forward(b - a, depth / model.cfg.n_layers)
        return b

    done = 0
    while done < len(held):
        done = backoff.run(lambda bs, a=done: run(a, min(a + bs, len(held))))
    return [tuple(torch.cat(part).cpu().numpy() for part in zip(*e, strict=True)) if e else
            (np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32))
            for e in entries]  # fmt: skip


def candidate_slots(kept: pd.DataFrame, tokens: np.ndarray, rows: tuple[int, ...],
                    vocab: int) -> Slots:  # fmt: skip
    """The tokens the `rules` labeller may name for each feature: of those at, before and after
    the positions its top and quantile contexts were kept for (`kept`: write.kept_contexts,
    contexts by feed index), the CANDIDATES most frequent of each kind (ties: the lower id)."""
    row = np.asarray(rows, dtype=np.int64)[kept["context"].to_numpy()]
    pos = kept["position"].to_numpy()
    t = tokens.shape[1]
    parts = []
    for kind, shift in zip(KINDS, (0, -1, 1), strict=True):
        at = pos + shift
        ok = (at >= 0) & (at < t)
        parts.append(pd.DataFrame({
            "feature": kept["feature"].to_numpy()[ok], "kind": kind,
            "token": np.asarray(tokens[row[ok], at[ok]], dtype=np.int64),
        }))  # fmt: skip
    seen = pd.concat(parts).value_counts(["feature", "kind", "token"]).rename("n").reset_index()
    seen = seen.sort_values(["feature", "kind", "n", "token"], ascending=[True, True, False, True])
    top = seen.groupby(["feature", "kind"], sort=False).head(CANDIDATES)
    return Slots.of(top["feature"], top["kind"], top["token"], vocab)


def read_out(model, members: list[Member], tokens, rows, vocab, opts, first, metas, pass_total,
             held: np.ndarray, batch: int, seed: int):  # fmt: skip
    """Write every member's folder; returns their summaries. The windows of all members are
    read in one sweep over the contexts they kept (the model once per context for the group),
    which also counts, per member, how well each candidate rule predicts firing there (the
    `rules` labeller's choice); then one pass over the held-out contexts scores every
    labeller's rules and their control. Each member's cost (forward-pass equivalents a context
    read) is its share of the job's: the pass over `rows` (`pass_total`), the windows' sweep and
    the held-out pass, divided among the members."""
    device = next(model.parameters()).device
    t = int(tokens.shape[1])
    d_vocab = int(model.cfg.d_vocab)
    results = [m.collector.result() for m in members]
    kept = [write.kept_contexts(r) for r in results]
    written = PositionCounts(d_vocab, t, device)  # the positions the labels are written from
    choice = [
        AtomCounts(candidate_slots(k, tokens, rows, d_vocab), m.sae.cfg.d_sae, written)
        for k, m in zip(kept, members, strict=True)
    ]
    sweep = PassCounter()
    windows = read_windows_many(
        [tuple(k[c].to_numpy() for c in ("feature", "context", "position")) for k in kept],
        group_reader(model, members, tokens, rows, sweep, choice, first),
        left=opts.window[0],
        right=opts.window[1],
        first_position=first,
        every_dictionary=True,  # each member counts every context read
    )
    conditions = condition_names(t)
    tables, promoted = [], []
    for m, stats, k, c in zip(members, results, kept, choice, strict=True):
        logit = top_logits(m.sae, model, k=opts.promoted_tokens)
        top = k[k["kind"] == "top"]
        ids = np.asarray(tokens[np.asarray(rows)[top["context"].to_numpy()],
                                top["position"].to_numpy()], dtype=np.int64)  # fmt: skip
        value = stats.top_value[top["feature"].to_numpy(), top["rank"].to_numpy()]
        by_name = {
            "tokens": token_rules(top["feature"].to_numpy(), ids, value, len(stats.count)),
            "rules": choose(c)[0],
        }
        live = stats.count > 0
        order = control_order(live, seed)
        by_name |= {f"{n}:control": r.take(order) for n, r in list(by_name.items())}
        tables.append((by_name, live))
        promoted.append((logit, [vocab[i[0]] if len(i) else "" for i in logit.top_ids]))
    del choice  # the chosen rules are in `tables`
    scored_at = PositionCounts(d_vocab, t, device)  # the held-out positions
    scoring = [
        AtomCounts(Slots.for_rules(list(by_name.values()), d_vocab), m.sae.cfg.d_sae, scored_at)
        for (by_name, _), m in zip(tables, members, strict=True)
    ]
    held_cost = PassCounter()
    fired = score_pass(model, members, held, batch, first, scoring, held_cost)
    summaries = []
    for i, (m, stats, wins, meta) in enumerate(zip(members, results, windows, metas, strict=True)):
        (by_name, live), (logit, top_promoted) = tables[i], promoted[i]
        scored = {name: score(r, scoring[i]) for name, r in by_name.items()}
        label_cols, labels_summary = label_columns(
            LABELLERS,
            {
                n: texts(by_name[n], vocab, conditions, top_promoted, by_name["tokens"])
                for n in LABELLERS
            },  # fmt: skip
            {n: scored[n] for n in LABELLERS},
            {n: scored[f"{n}:control"] for n in LABELLERS},
            live,
            opts.labeller,
        )
        labels_summary |= {
            "held_out_contexts": len(held),
            "held_out_tokens": scored_at.total,
            "conditions": conditions,
        }
        feats, ctx, summary = write.build(
            stats, logit, None, vocab, window=opts.window, first_position=first, meta=meta,
            windows=wins, labels=label_cols, labels_summary=labels_summary,
        )  # fmt: skip
        ex = held_out_examples(*fired[i], held, live, opts.explainer.examples, opts.window,
                               first, seed)  # fmt: skip
        ex = write.example_table(ex, vocab)
        # The collector counts contexts in the order fed; the files name token set rows.
        ctx["context"] = np.asarray(rows, dtype=np.int64)[ctx["context"].to_numpy()]
        share = PassCounter()
        for part, total in (("pass", pass_total), ("windows", sweep.total()),
                            ("held_out", held_cost.total())):  # fmt: skip
            with share.part(part):
                share.forward(1, total / len(members))
        summary |= share.summary(len(rows), unit="context")
        if len(stats.count) and not live.any():
            log.warning("features %s layer %d: dead dictionary: none of its %d latents fired on "
                        "%d contexts; every feature is written dead", m.site, m.layer,
                        len(stats.count), stats.n_contexts)  # fmt: skip
        write.write(m.out, feats, ctx, summary, ex)
        summaries.append(summary)
    return summaries


# --- the stage ------------------------------------------------------------------------------------
def run(
    config: dict,
    model_json: Path | str,
    tokens_npy: Path | str,
    tokens_json: Path | str,
    sae_dirs: list[Path | str],
    out_dirs: list[Path | str],
    held_out: tuple[Path | str, Path | str],
    checkpoint_dir: Path | str | None = None,
    progress: bool = True,
) -> list[dict]:
    """The stage: every dictionary in `sae_dirs` (saes/{site}/layer_{layer}) into the matching
    `out_dirs` (features/{site}/layer_{layer}), its labels scored on the contexts of
    `held_out` (held_out_tokens.npy and .json, features/held_out.py); returns their
    summaries."""
    from circuitflow.capture.tokens import read_token_set
    from circuitflow.errors import ConfigError, InputError
    from circuitflow.features import held_out as held_out_tokens
    from circuitflow.model.load import load_model, load_tokenizer
    from circuitflow.nodes import site_layer
    from circuitflow.sae.files import check_sae_dir, load_sae

    if len(sae_dirs) != len(out_dirs):
        raise ConfigError("--saes and --out must name the same number of folders")
    opts = FeaturesConfig.from_dict(config["features"])
    # On the CPU, every large block gets its own mapping and goes back when freed: the read-out's
    # many chunk-sized tensors between small arrays otherwise leave glibc's heap fragmented
    # (measured: +283 MiB resident on the embedded default, none of it live).
    memory.track_live_bytes_on_cpu()
    for d in sae_dirs:  # before the model: a damaged dictionary is refused in a second
        check_sae_dir(d)
    tokens, token_meta = read_token_set(tokens_npy, tokens_json)
    held, held_meta = held_out_tokens.read(*held_out)
    if held_meta.get("held_out_from") != token_meta.get("token_set_hash") or (
        held.shape[1] != tokens.shape[1]
    ):
        raise InputError(
            f"{held_out[1]}: held out from another token set than {tokens_json}; rerun "
            f"{held_out_tokens.RULE}"
        )
    model_dir = Path(model_json).parent
    model = load_model(model_dir, config["device"], config["model"]["dtype"])
    device = next(model.parameters()).device
    first = int(bool(config["capture"]["exclude_bos"]))
    t = int(tokens.shape[1])
    wanted = -(-opts.n_tokens // (t - first))
    chosen = fplan.contexts(dictionary_sources.token_set_source(config).name, len(tokens),
                            int(token_meta.get("held_out_contexts", 0)), wanted)  # fmt: skip
    members = []
    for sae_dir, out in zip(sae_dirs, out_dirs, strict=True):
        sae = load_sae(sae_dir, device)
        site, layer = Path(sae_dir).parent.name, int(Path(sae_dir).name.removeprefix("layer_"))
        if site_layer(sae.cfg.metadata.hook_name)[1] != layer:
            raise ConfigError(f"{sae_dir}: reads {sae.cfg.metadata.hook_name}, not layer {layer}")
        col = Collector(sae.cfg.d_sae, k=opts.k, samples=opts.samples, seed=config["seed"],
                        dense_threshold=opts.dense_threshold, first_position=first,
                        device=device)  # fmt: skip
        members.append(Member(site, layer, sae, Path(sae_dir), Path(out), col))
    batch = opts.batch_contexts or plan_batch(config, members, model, t, len(chosen.rows))
    key = checkpoint_key(members, token_meta, chosen.rows, opts, config["seed"])
    ckpt = Path(checkpoint_dir) / CHECKPOINT if checkpoint_dir else None
    fed = load_checkpoint(ckpt, key, members) if ckpt else 0
    if fed:
        log.info("resuming at context %d of %d", fed, len(chosen.rows))
    every = max(1, -(-opts.checkpoint_tokens // (t - first)))
    t0 = time.perf_counter()
    feed(model, members, tokens, chosen.rows, batch, fed,
         (ckpt, key, every) if ckpt else None, PassCounter(), progress)  # fmt: skip
    pass_seconds = time.perf_counter() - t0
    # The pass through the deepest member's layer, over every context (a resumed job's too).
    depth = max(m.layer for m in members) + 1
    pass_total = len(chosen.rows) * depth / model.cfg.n_layers
    vocab = vocabulary(load_tokenizer(model_dir), model.cfg.d_vocab)
    token_set = (tokens_npy, token_meta)
    metas = [
        summary_meta(m, members, config, token_set, chosen, pass_seconds, batch) for m in members
    ]
    summaries = read_out(model, members, tokens, chosen.rows, vocab, opts, first, metas,
                         pass_total, held, batch, config["seed"])  # fmt: skip
    total = sum(s["forward_equivalents_per_prompt"] for s in summaries)
    log.info("features: %d dictionaries, %d contexts, %.1f s pass, %.2f forward equivalents a "
             "context", len(members), len(chosen.rows), pass_seconds, total)  # fmt: skip
    if ckpt is not None and ckpt.exists():
        ckpt.unlink()
    return summaries


def summary_meta(m: Member, members: list[Member], config: dict, token_set: tuple,
                 chosen: fplan.Contexts, pass_seconds: float, batch: int) -> dict:  # fmt: skip
    """What summary.json says of a member beside its statistics: the dictionary, the token set
    and contexts read, and the job's pass."""
    source = dictionary_sources.source_of(config, m.site).name
    return {
        "site": m.site,
        "layer": m.layer,
        "hook": m.hook,
        "dictionary": str(m.sae_dir),
        "dictionary_kind": m.kind,
        "sae_source": source,
        # Its Neuronpedia id (a published dictionary's), where it names one: every page that
        # shows one of its features links the feature's Neuronpedia page.
        "neuronpedia_id": getattr(m.sae.cfg.metadata, "neuronpedia_id", None),
        "token_set": str(token_set[0]),
        "token_set_hash": token_set[1].get("token_set_hash"),
        "contexts_held_out": chosen.held_out,
        "contexts_trained_on": chosen.trained_on,
        "contexts_note": fplan.CONTEXTS_NOTE[dictionary_sources.token_set_source(config).name],
        "pass_seconds": round(pass_seconds, 3),
        "batch_contexts": batch,
        "job_members": [f"{x.site}:{x.layer}" for x in members],
    }


def plan_batch(config: dict, members: list[Member], model, t: int, n_contexts: int) -> int:
    """The largest batch of contexts (at most capture.max_batch_size and the contexts read)
    whose planned peak (plan.estimate) fits the device's available memory."""
    device = str(next(model.parameters()).device)
    group = fplan.FeatureGroup(tuple((m.site, m.layer) for m in members))
    # The members' own k where they state one (published TopK dictionaries), as planned.
    ks = [getattr(m.sae.cfg, "k", None) for m in members]
    active = max(ks) if all(isinstance(k, int) for k in ks) else None
    d_sae = max(int(m.sae.cfg.d_sae) for m in members)
    est = fplan.estimate(config, group, device, d_sae, active)
    batch = memory.plan_batch_size(
        est,
        min(config["capture"]["max_batch_size"], n_contexts),
        config["capture"]["memory_fraction"],
        available=memory.available_bytes(device) + est.weights,
    )
    log.info("%s", batch.describe())
    return batch.batch_size
