"""Ablations and steering: run the model with some nodes' activations replaced, and score it.

Nodes are `circuitflow.nodes.Node`s (the token embedding, heads, MLPs, SAE features and error
terms), with the ids of the attribution graph.

Ablation kinds (what an ablated node's activation becomes):

* `zero`: zero.
* `mean`: its mean over a reference prompt set, position by position (prompts of one behaviour
  share a length; prompts are grouped by length otherwise): the behaviour's own clean prompts
  (`mean_reference: clean`, the prompt distribution) or their corrupted twins (`corrupted`).
* `resample`: its value on a corrupted prompt drawn at random (a permutation per seed, within
  prompts of the same length), as in resample ablation / causal scrubbing.
* `patch` (not a config value): its value on the prompt's own corrupted twin, activation
  patching's counterfactual. The patching circuit ("what carries the difference", ranked by
  attribution against the corrupted prompt) is judged by it.

SAE nodes are ablated inside the activation without replacing it by the SAE's reconstruction:
the SAE is spliced with its error term, x = decode(a) + e, a = encode(x), e = x - decode(a), and
the ablated features F and (when ablated) the error term take their reference values:
x <- x + (a_ref - a)[F] W_dec[F] + (e_ref - e). SAEs trained without BOS are bypassed at BOS
(features 0 there, the error term carries it), as in attribution. The activation is encoded
once per hook, so
ablating a set of features at once is the same as ablating them in one spliced forward; every
node not ablated keeps its value. Ablating every feature and the error term of a hook replaces
its activation by the reference exactly (the decoder is affine). Steering adds alpha * direction
to the hook's output at every position but the first (BOS, the attention sink).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow import memory
from circuitflow.attribution.splice import encode
from circuitflow.batching import by_length
from circuitflow.errors import ConfigError
from circuitflow.model.forward import last_logits
from circuitflow.nodes import Node, hook_name
from circuitflow.perf import PassCounter

KINDS = ("zero", "mean", "resample")  # interventions.ablation
PATCH = "patch"  # the patching circuit's counterfactual: each prompt's own corrupted twin
REFERENCES = ("clean", "corrupted")


@dataclass
class Outcome:
    """Per-prompt results of one (possibly ablated) run, in the prompt table's row order."""

    logit_diff: np.ndarray
    correct: np.ndarray  # answer logit > distractor logit
    top_token: np.ndarray
    top_prob: np.ndarray
    top1_correct: np.ndarray
    mean_logits: np.ndarray  # [d_vocab] mean last-position logits over prompts

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "logit_diff": self.logit_diff,
                "correct": self.correct,
                "top_token": self.top_token,
                "top_prob": self.top_prob,
                "top1_correct": self.top1_correct,
            }
        )


@dataclass
class PromptGroup:
    """Prompts of one token length, batched together (no padding)."""

    rows: np.ndarray  # positions in the prompt table
    clean: torch.Tensor
    corrupted: torch.Tensor
    answer: torch.Tensor
    distractor: torch.Tensor


@dataclass(frozen=True)
class Request:
    """One run: `nodes` ablated (the Intervener's kind), `steer` vectors ((hook, vector
    [d_model])) added, `seed` for the resample draw."""

    nodes: frozenset = frozenset()
    seed: int = 0
    steer: tuple = ()


class Intervener:
    """Runs the model on a prompt set with ablated and steered nodes, several runs per forward
    pass: the runs are stacked along the batch (copy k of the prompts carries run k's
    ablation), and their outcomes come back to the host once per pass.

    Reference activations (means, corrupted runs) are computed once per hook on first use.
    """

    def __init__(
        self,
        model,
        prompts: pd.DataFrame,
        kind: str = "mean",
        mean_reference: str = "clean",
        batch_size: int = 64,
        saes: dict[str, Any] | None = None,
        bypass_bos: bool = False,
        runs_per_pass: int = 16,
        counter: PassCounter | None = None,
    ):
        if kind not in (*KINDS, PATCH):
            raise ConfigError(f"ablation: {kind!r}; allowed values: {', '.join(KINDS)}")
        if mean_reference not in REFERENCES:
            raise ConfigError(
                f"mean_reference: {mean_reference!r}; allowed values: {', '.join(REFERENCES)}"
            )
        self.model = model
        self.kind = kind
        self.mean_reference = mean_reference
        self.batch_size = batch_size
        # Every batch of prompts goes through this: an OOM halves the batch (memory.OOMBackoff).
        self.backoff = memory.OOMBackoff(
            max(1, min(batch_size, len(prompts))),  # so a halving halves what runs
            str(next(model.parameters()).device),
            stage="interventions",
        )
        self.saes = saes or {}
        self.bypass_bos = bypass_bos  # SAEs trained without BOS are bypassed there
        self.runs_per_pass = max(1, runs_per_pass)
        self.counter = counter or PassCounter()
        self.device = next(model.parameters()).device
        self.n = len(prompts)
        self.groups = self._groups(prompts)
        self._ref: dict[tuple, Any] = {}
        self.final_resid = hook_name("resid_post", model.cfg.n_layers - 1)

    def with_kind(self, kind: str) -> Intervener:
        """The same prompts, batching, SAEs and counter under another ablation `kind` (such as
        PATCH), sharing the clean and corrupted activations already computed."""
        if kind not in (*KINDS, PATCH):
            raise ConfigError(f"ablation: {kind!r}; allowed values: {', '.join(KINDS)}")
        other = copy.copy(self)
        other.kind = kind
        other._ref = {k: v for k, v in self._ref.items() if k[0] in ("acts", "sae")}
        return other

    def _groups(self, prompts: pd.DataFrame) -> list[PromptGroup]:
        groups = []
        for rows in by_length(prompts["clean_tokens"]):
            sub = prompts.iloc[rows]

            def stack(col: str, sub: pd.DataFrame = sub) -> torch.Tensor:
                return torch.tensor(np.stack(sub[col].to_list()), dtype=torch.long)

            groups.append(
                PromptGroup(
                    rows,
                    stack("clean_tokens"),
                    stack("corrupted_tokens"),
                    torch.tensor(sub["answer_id"].to_numpy(copy=True), dtype=torch.long),
                    torch.tensor(sub["distractor_id"].to_numpy(copy=True), dtype=torch.long),
                )
            )
        return groups

    # --- reference activations ----------------------------------------------------------------
    @torch.no_grad()
    def _activations(self, hook: str, which: str, g: int) -> torch.Tensor:
        """The hook's activation [n_group, pos, ...] on the group's clean or corrupted prompts."""
        key = ("acts", hook, which, g)
        if key not in self._ref:
            tokens = getattr(self.groups[g], which)

            def one(start: int, stop: int) -> torch.Tensor:
                store: dict[str, torch.Tensor] = {}

                def save(act, hook, store=store):
                    store["a"] = act.detach()

                batch = tokens[start:stop].to(self.device)
                with self.model.hooks(fwd_hooks=[(hook, save)]):
                    self.model(batch)
                self.counter.forward(len(batch))
                return store["a"]

            self._ref[key] = torch.cat(list(self.backoff.chunks(len(tokens), one)))
        return self._ref[key]

    def _sae_parts(self, hook: str, which: str, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The SAE's feature activations [n, pos, d_sae] and error term [n, pos, d] at `hook`."""
        key = ("sae", hook, which, g)
        if key not in self._ref:
            sae = self.saes[hook]
            x = self._activations(hook, which, g)
            with torch.no_grad():
                feats = encode(sae, x, self.bypass_bos)
                error = x.float() - sae.decode(feats).float()
            self._ref[key] = (feats.float(), error)
        return self._ref[key]

    def _feature_acts(self, hook: str, which: str, g: int) -> torch.Tensor:
        return self._sae_parts(hook, which, g)[0]

    def _reference(self, hook: str, part: str, g: int, rows: np.ndarray, perms: list):
        """What an ablated node's activation becomes, for copy k of prompts `rows` of group `g`
        (broadcastable to [K, b, pos, ...]): `part` is `acts` (components), `feats` or
        `error` (SAE nodes at `hook`); `perms` holds each copy's resample permutation."""
        if self.kind == "zero":
            return 0.0
        get = {
            "acts": self._activations,
            "feats": self._feature_acts,
            "error": lambda h, w, gi: self._sae_parts(h, w, gi)[1],
        }[part]
        if self.kind == "mean":
            key = ("mean", hook, self.mean_reference, g, part)
            if key not in self._ref:
                self._ref[key] = get(hook, self.mean_reference, g).mean(0)[None, None]
            return self._ref[key]
        acts = get(hook, "corrupted", g)
        idx = torch.as_tensor(np.stack([perm[rows] for perm in perms]), device=acts.device)
        return acts[idx]  # [K, b, pos, ...]

    # --- hooks --------------------------------------------------------------------------------
    def _hook_fn(self, name: str, nodes: list[list[Node]], steer: list[list], g, rows, perms):
        """The hook at `name` for a pass of len(nodes) copies of prompts `rows` of group `g`:
        copy i ablates `nodes[i]` (its nodes at this hook) and adds the vectors `steer[i]`."""
        k, dev = len(nodes), self.device
        heads, whole, feats, error = {}, [], {}, []
        for i, at_hook in enumerate(nodes):
            for node in at_hook:
                if node.kind == "head":
                    heads.setdefault(i, []).append(node.index)
                elif node.kind == "feature":
                    feats.setdefault(i, []).append(node.index)
                elif node.kind == "error":
                    error.append(i)
                else:
                    whole.append(i)
        # The last layer's residual stream reaches the scored logits (the last position's) only
        # at that position: its SAE nodes are spliced there alone (a 1/pos share of the work).
        last_only = name == self.final_resid

        def mask(indices: list[int]) -> torch.Tensor:
            m = torch.zeros(k, dtype=torch.bool, device=dev)
            m[indices] = True
            return m

        def fn(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
            act = act.view(k, -1, *act.shape[1:]).clone()  # [K, b, pos, ...]
            if heads:
                m = torch.zeros(k, act.shape[3], dtype=torch.bool, device=dev)
                for i, idx in heads.items():
                    m[i, idx] = True
                ref = self._reference(name, "acts", g, rows, perms)
                act = torch.where(m[:, None, None, :, None], torch.as_tensor(ref).to(act), act)
            if whole:
                ref = self._reference(name, "acts", g, rows, perms)
                m = mask(whole)[:, None, None, None]
                act = torch.where(m, torch.as_tensor(ref).to(act), act)
            if feats or error:
                at = slice(-1, None) if last_only else slice(None)
                delta = self._sae_delta(name, act[:, :, at], feats, mask(error), g, rows, perms)
                act[:, :, at] += delta
            for i, vecs in enumerate(steer):
                for vec in vecs:
                    act[i, :, 1:] += vec.to(act)
            return act.flatten(0, 1)

        return fn

    def _sae_delta(
        self,
        hook: str,
        act: torch.Tensor,
        feats: dict,
        error: torch.Tensor,
        g: int,
        rows: np.ndarray,
        perms: list,
    ) -> torch.Tensor:
        """(a_ref - a)[F_k] W_dec[F_k] + (e_ref - e) [copy k's error ablated] for the spliced SAE
        at `hook` (one encode), per copy k of `act` [K, b, pos, d]: every position, or the
        last alone when `act` holds one position of longer prompts (see _hook_fn)."""
        sae = self.saes[hook]
        last = act.shape[2] < self.groups[g].clean.shape[1]  # not BOS: nothing to bypass

        def reference(part: str):
            ref = torch.as_tensor(self._reference(hook, part, g, rows, perms))
            return ref[:, :, -1:] if last and ref.dim() > 2 else ref

        a = encode(sae, act.flatten(0, 1), self.bypass_bos and not last)
        a = a.float().view(*act.shape[:3], -1)
        delta = torch.zeros(act.shape, dtype=torch.float32, device=act.device)
        if feats:
            m = torch.zeros(act.shape[0], a.shape[-1], dtype=torch.bool, device=act.device)
            for i, idx in feats.items():
                m[i, idx] = True
            moved = torch.where(m[:, None, None, :], reference("feats").to(a) - a, 0.0)
            delta += moved @ sae.W_dec.float()
        if error.any():
            e = act.float() - sae.decode(a.to(sae.dtype)).float()
            ref = reference("error")
            delta += torch.where(error[:, None, None, None], ref.to(e) - e, 0.0)
        return delta.to(act.dtype)

    # --- runs ---------------------------------------------------------------------------------
    @torch.no_grad()
    def run(
        self,
        ablate: Iterable[Node] = (),
        seed: int = 0,
        steer: Sequence[tuple[str, torch.Tensor]] = (),
    ) -> Outcome:
        """Score the prompts with `ablate` ablated (this object's kind) and `steer` vectors
        ((hook, vector [d_model])) added. `seed` drives the resample draw."""
        return self.run_many([Request(frozenset(ablate), seed, tuple(steer))])[0]

    @torch.no_grad()
    def run_many(self, runs: list[Request]) -> list[Outcome]:
        """Score the prompts under each run, `runs_per_pass` runs per forward pass."""
        outcomes = [_Accumulator(self.n, self.model.cfg.d_vocab_out) for _ in runs]
        self._warm(runs)
        hooks = {node.hook for run in runs for node in run.nodes}
        hooks |= {hook for run in runs for hook, _ in run.steer}
        for start in range(0, len(runs), self.runs_per_pass):
            chunk = list(range(start, min(start + self.runs_per_pass, len(runs))))
            chunk_runs = [runs[i] for i in chunk]
            at_hook = {h: [[] for _ in chunk_runs] for h in hooks}  # [hook][copy] -> nodes
            steers = {h: [[] for _ in chunk_runs] for h in hooks}
            for i, run in enumerate(chunk_runs):
                for node in run.nodes:
                    at_hook[node.hook][i].append(node)
                for h, vec in run.steer:
                    steers[h][i].append(vec)
            for g, group in enumerate(self.groups):
                perms = [self._permutation(run.seed, group) for run in chunk_runs]

                def one(
                    start,
                    stop,
                    g=g,
                    group=group,
                    chunk_runs=chunk_runs,
                    perms=perms,
                    at_hook=at_hook,
                    steers=steers,
                ):
                    rows = np.arange(start, stop)
                    fwd = [
                        (h, self._hook_fn(h, at_hook[h], steers[h], g, rows, perms))
                        for h in sorted(hooks)
                    ]
                    tokens = group.clean[rows].to(self.device).repeat(len(chunk_runs), 1)
                    with self.model.hooks(fwd_hooks=fwd):
                        logits = last_logits(self.model, tokens)
                    self.counter.forward(len(tokens))
                    last = logits.float().view(len(chunk_runs), len(rows), -1)
                    answer, distractor = group.answer[rows], group.distractor[rows]
                    stats = _last_position_stats(
                        last, answer.to(self.device), distractor.to(self.device)
                    )
                    return rows, stats

                for rows, stats in self.backoff.chunks(len(group.rows), one):
                    for k, i in enumerate(chunk):
                        outcomes[i].add(group.rows[rows], {name: v[k] for name, v in stats.items()})
        return [acc.outcome() for acc in outcomes]

    def _warm(self, runs: list[Request]) -> None:
        """Compute the reference activations the runs need before any ablated pass: a reference
        computed lazily inside a hook would run the model under its own hooks."""
        if self.kind == "zero":
            return
        parts = set()
        for run in runs:
            for node in run.nodes:
                part = {"feature": "feats", "error": "error"}.get(node.kind, "acts")
                parts.add((node.hook, part))
        for g, group in enumerate(self.groups):
            perms = [np.arange(len(group.rows))]
            for hook, part in sorted(parts):
                self._reference(hook, part, g, np.arange(0), perms)

    def _permutation(self, seed: int, group: PromptGroup) -> np.ndarray:
        """Run `seed`'s draw of corrupted prompts (resample ablation), within the group."""
        if self.kind != "resample":
            return np.arange(len(group.rows))
        rng = np.random.default_rng([seed, len(group.rows), group.clean.shape[1]])
        return rng.permutation(len(group.rows))


def _last_position_stats(last: torch.Tensor, answer: torch.Tensor, distractor: torch.Tensor):
    """Per copy and prompt ([K, b, vocab] float32 logits): the metric and what the tables show,
    moved to the host at once (one synchronisation per pass)."""
    la = last.gather(-1, answer.expand(last.shape[0], -1)[..., None]).squeeze(-1)
    ld = last.gather(-1, distractor.expand(last.shape[0], -1)[..., None]).squeeze(-1)
    top = last.argmax(-1)
    out = {
        "logit_diff": la - ld,
        "correct": la > ld,
        "top_token": top,
        "top_prob": last.softmax(-1).max(-1).values,
        "top1": top == answer,
        "logit_sum": last.double().sum(1),
    }
    return {k: v.cpu().numpy() for k, v in out.items()}


class _Accumulator:
    """One run's per-prompt results, filled pass by pass in the prompt table's row order."""

    def __init__(self, n: int, vocab: int):
        self.n = n
        self.logit_diff = np.zeros(n)
        self.correct = np.zeros(n, dtype=bool)
        self.top_token = np.zeros(n, dtype=np.int64)
        self.top_prob = np.zeros(n)
        self.top1 = np.zeros(n, dtype=bool)
        self.logit_sum = np.zeros(vocab, dtype=np.float64)

    def add(self, rows: np.ndarray, stats: dict) -> None:
        self.logit_diff[rows] = stats["logit_diff"]
        self.correct[rows] = stats["correct"]
        self.top_token[rows] = stats["top_token"]
        self.top_prob[rows] = stats["top_prob"]
        self.top1[rows] = stats["top1"]
        self.logit_sum += stats["logit_sum"]

    def outcome(self) -> Outcome:
        return Outcome(
            self.logit_diff,
            self.correct,
            self.top_token,
            self.top_prob,
            self.top1,
            self.logit_sum / self.n,
        )


def calibration_error(outcome: Outcome, n_bins: int = 10) -> float:
    """Expected calibration error of the top-token probability against top-1 correctness, as
    the baseline stage computes it."""
    from circuitflow.baseline import calibration_table, expected_calibration_error

    return expected_calibration_error(calibration_table(outcome.frame(), n_bins))
