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

SAE nodes are ablated inside the activation without replacing it by the SAE's reconstruction:
the SAE is spliced with its error term, x = decode(a) + e, a = encode(x), e = x - decode(a), and
the ablated features F and (when ablated) the error term take their reference values:
x <- x + (a_ref - a)[F] W_dec[F] + (e_ref - e). The activation is encoded once per hook, so
ablating a set of features at once is the same as ablating them in one spliced forward; every
node not ablated keeps its value. Ablating every feature and the error term of a hook replaces
its activation by the reference exactly (the decoder is affine). Steering adds alpha * direction
to the hook's output at every position but the first (BOS, the attention sink).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from circuitflow.errors import ConfigError
from circuitflow.nodes import Node
from circuitflow.prompts import by_length

KINDS = ("zero", "mean", "resample")
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


@dataclass
class _Context:
    group: int = 0
    rows: slice = field(default_factory=lambda: slice(0, 0))
    perm: np.ndarray | None = None


class Intervener:
    """Runs the model on a prompt set with ablated and steered nodes.

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
    ):
        if kind not in KINDS:
            raise ConfigError(f"ablation: {kind!r}; allowed values: {', '.join(KINDS)}")
        if mean_reference not in REFERENCES:
            raise ConfigError(
                f"mean_reference: {mean_reference!r}; allowed values: {', '.join(REFERENCES)}"
            )
        self.model = model
        self.kind = kind
        self.mean_reference = mean_reference
        self.batch_size = batch_size
        self.saes = saes or {}
        self.device = next(model.parameters()).device
        self.n = len(prompts)
        self.groups = self._groups(prompts)
        self._ref: dict[tuple[str, str, int], torch.Tensor] = {}
        self._ctx = _Context()

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
            chunks = []
            for s in range(0, len(tokens), self.batch_size):
                store: dict[str, torch.Tensor] = {}

                def save(act, hook, store=store):
                    store["a"] = act.detach()

                with self.model.hooks(fwd_hooks=[(hook, save)]):
                    self.model(tokens[s : s + self.batch_size].to(self.device))
                chunks.append(store["a"])
            self._ref[key] = torch.cat(chunks)
        return self._ref[key]

    def _sae_parts(self, hook: str, which: str, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The SAE's feature activations [n, pos, d_sae] and error term [n, pos, d] at `hook`."""
        key = ("sae", hook, which, g)
        if key not in self._ref:
            sae = self.saes[hook]
            x = self._activations(hook, which, g)
            with torch.no_grad():
                feats = sae.encode(x.to(sae.dtype))
                error = x.float() - sae.decode(feats).float()
            self._ref[key] = (feats.float(), error)
        return self._ref[key]

    def _feature_acts(self, hook: str, which: str, g: int) -> torch.Tensor:
        return self._sae_parts(hook, which, g)[0]

    def _error_acts(self, hook: str, which: str, g: int) -> torch.Tensor:
        return self._sae_parts(hook, which, g)[1]

    def _replacement(self, hook: str, part: str) -> torch.Tensor | float:
        """What an ablated node's activation becomes for the current chunk (broadcastable):
        `part` is `acts` (components), `feats` or `error` (SAE nodes at `hook`)."""
        ctx = self._ctx
        if self.kind == "zero":
            return 0.0
        get = {"acts": self._activations, "feats": self._feature_acts, "error": self._error_acts}
        if self.kind == "mean":
            key = ("mean", hook, self.mean_reference, ctx.group, part)
            if key not in self._ref:
                self._ref[key] = get[part](hook, self.mean_reference, ctx.group).mean(
                    0, keepdim=True
                )
            return self._ref[key]
        acts = get[part](hook, "corrupted", ctx.group)
        rows = np.arange(len(acts))[ctx.rows]
        idx = ctx.perm[rows] if ctx.perm is not None else rows
        return acts[torch.as_tensor(idx, device=acts.device)]

    @staticmethod
    def _parts(nodes: list[Node]) -> list[str]:
        kinds = {n.kind for n in nodes}
        parts = ["feats"] if "feature" in kinds else []
        parts += ["error"] if "error" in kinds else []
        return parts + (["acts"] if kinds - {"feature", "error"} else [])

    def _prepare(self, by_hook: dict[str, list[Node]]) -> None:
        """Compute reference activations before any hook is on (they are clean forward passes)."""
        if self.kind == "zero":
            return
        for hook, nodes in by_hook.items():
            for g in range(len(self.groups)):
                self._ctx = _Context(g, slice(0, 1), np.arange(len(self.groups[g].rows)))
                for part in self._parts(nodes):
                    self._replacement(hook, part)

    # --- hooks --------------------------------------------------------------------------------
    def _hook_fn(self, name: str, nodes: list[Node], steer: list[torch.Tensor]):
        components = [n for n in nodes if not n.is_sae]
        features = [n.index for n in nodes if n.kind == "feature"]
        error = any(n.kind == "error" for n in nodes)

        def fn(act: torch.Tensor, hook: Any = None) -> torch.Tensor:
            act = act.clone()
            for node in components:
                value = self._replacement(name, "acts")
                if node.kind == "head":
                    v = value if isinstance(value, float) else value[:, :, node.index]
                    act[:, :, node.index] = v
                else:
                    act[:] = value
            if features or error:
                act = act + self._sae_delta(name, act, features, error).to(act.dtype)
            for vec in steer:
                act[:, 1:] = act[:, 1:] + vec.to(act.dtype)
            return act

        return fn

    def _sae_delta(
        self, hook: str, act: torch.Tensor, features: list[int], error: bool
    ) -> torch.Tensor:
        """(a_ref - a)[F] W_dec[F] + (e_ref - e) for the spliced SAE at `hook` (one encode)."""
        sae = self.saes[hook]
        a = sae.encode(act.to(sae.dtype)).float()
        delta = torch.zeros(act.shape, dtype=torch.float32, device=act.device)
        if features:
            idx = torch.as_tensor(features, device=act.device)
            ref = self._replacement(hook, "feats")
            ref = ref if isinstance(ref, float) else ref[..., idx]
            delta += (ref - a[..., idx]) @ sae.W_dec[idx].float()
        if error:
            e = act.float() - sae.decode(a.to(sae.dtype)).float()
            delta += self._replacement(hook, "error") - e
        return delta

    @torch.no_grad()
    def run(
        self,
        ablate: Iterable[Node] = (),
        seed: int = 0,
        steer: Sequence[tuple[str, torch.Tensor]] = (),
    ) -> Outcome:
        """Score the prompts with `ablate` ablated (this object's kind) and `steer` vectors
        ((hook, vector [d_model])) added. `seed` drives the resample draw."""
        by_hook: dict[str, list[Node]] = {}
        for node in ablate:
            by_hook.setdefault(node.hook, []).append(node)
        steer_by_hook: dict[str, list[torch.Tensor]] = {}
        for hook, vec in steer:
            steer_by_hook.setdefault(hook, []).append(vec.to(self.device))
        self._prepare(by_hook)
        hooks = [
            (h, self._hook_fn(h, by_hook.get(h, []), steer_by_hook.get(h, [])))
            for h in sorted(set(by_hook) | set(steer_by_hook))
        ]
        vocab = self.model.cfg.d_vocab_out
        logit_diff = np.zeros(self.n)
        correct = np.zeros(self.n, dtype=bool)
        top_token = np.zeros(self.n, dtype=np.int64)
        top_prob = np.zeros(self.n)
        top1 = np.zeros(self.n, dtype=bool)
        logit_sum = torch.zeros(vocab, dtype=torch.float64)
        for g, group in enumerate(self.groups):
            perm = None
            if self.kind == "resample":
                rng = np.random.default_rng([seed, len(group.rows), group.clean.shape[1]])
                perm = rng.permutation(len(group.rows))
            for s in range(0, len(group.rows), self.batch_size):
                sl = slice(s, s + self.batch_size)
                self._ctx = _Context(g, sl, perm)
                with self.model.hooks(fwd_hooks=hooks):
                    logits = self.model(group.clean[sl].to(self.device), return_type="logits")
                last = logits[:, -1].float().cpu()
                ans, dis = group.answer[sl], group.distractor[sl]
                r = torch.arange(len(ans))
                la, ld = last[r, ans], last[r, dis]
                probs = last.softmax(-1)
                top = last.argmax(-1)
                rows = group.rows[sl]
                logit_diff[rows] = (la - ld).numpy()
                correct[rows] = (la > ld).numpy()
                top_token[rows] = top.numpy()
                top_prob[rows] = probs.max(-1).values.numpy()
                top1[rows] = (top == ans).numpy()
                logit_sum += last.sum(0).double()
        return Outcome(logit_diff, correct, top_token, top_prob, top1, (logit_sum / self.n).numpy())


def calibration_error(outcome: Outcome, n_bins: int = 10) -> float:
    """Expected calibration error of the top-token probability against top-1 correctness, as
    the baseline stage computes it."""
    from circuitflow.baseline import calibration_table, expected_calibration_error

    return expected_calibration_error(calibration_table(outcome.frame(), n_bins))
