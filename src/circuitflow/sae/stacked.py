"""The GPU trainer's step (`sae.trainer: gpu`): TopK and BatchTopK SAEs and transcoders of one
shape trained as one stack, with no host synchronisation in a step.

SAELens's objective (MSE + AuxK on dead latents, decoder-norm rescaling, BatchTopK's threshold),
Adam, gradient clipping and firing statistics, computed for M dictionaries at once on stacked
parameters ([M, d_in, d_sae], ...): one batched matmul per product, one topk, one fused Adam
step. A single SAE is the one-member stack. Everything has a fixed shape, set by (M, batch, k):

- selection: TopK's `topk(k)` per token or BatchTopK's `topk(k * batch)` over the batch, both
  unsorted, as flat (token, latent) entries; no sort, no CSR, no nonzero;
- products: the entries scattered into a dense [M, batch, d_sae] matrix A, then dense bf16
  matmuls (`sae.autocast`; float32 otherwise) with float32 master weights: the decoder (A W_dec),
  the decoder's backward (A^T g; g W_dec^T read at the entries) and the encoder's backward
  (x^T G, G the gradient at the entries). On an H200 each is ~0.25 ms at GPT-2 small's size,
  while gather or scatter kernels over the entries (embedding_bag's backward, index_add_)
  sort, sync or add in a varying order;
- the encoder's forward is the one dense product SAELens also needs; autograd is not used: the
  backward above is written out, so no graph of [batch, d_sae] temporaries is kept;
- AuxK: the k_aux = d_in // 2 highest pre-activations per token among the dead latents by a
  topk over all latents with the live ones masked to -inf; picks past the dead count come back
  -inf and get weight 0 (SAELens's min(k_aux, dead) picks), and the loss's scale
  min(dead / k_aux, 1) is computed on the device;
- bookkeeping: firing counts by scatter_add (integer-valued floats: exact in any order), steps
  since each latent fired, BatchTopK's threshold: all device tensors;
- AuxK is skipped, exactly, when no latent can be dead yet: a latent is dead once it has not
  fired for more than `dead_feature_window` steps, and steps since firing grow by at most one a
  step, so a lagged reading r of max(steps since fired) taken j steps ago proves none is dead
  while r + j <= window. The reading is a non-blocking copy (HostReads) the step never waits for;
  when none has landed, AuxK runs, with the same result: its terms are added separately, so
  with nothing dead they add exact zeros.

On CPU the same code runs in float32 (tests compare it with SAELens's step and prove it free of
synchronisation); the CPU-tuned sparse trainer (sae.fast) stays faster there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from sae_lens.config import SAETrainerConfig
from sae_lens.training.optim import get_lr_scheduler
from torch import nn

from circuitflow.sae.transcoder import is_transcoder

PARAMS = ("W_enc", "b_enc", "W_dec", "b_dec")  # SAELens's names, in SAETrainer's Adam order


@dataclass(frozen=True)
class StepSpec:
    """What one step computes, from the members' (shared) SAELens config."""

    batchtopk: bool
    k: float  # BatchTopK's is a mean per token
    k_aux: int  # SAELens's d_in // 2 dead latents per token for AuxK
    aux_coefficient: float
    apply_b_dec_to_input: bool
    rescale: bool  # SAELens's rescale_acts_by_decoder_norm
    threshold_lr: float  # BatchTopK's topk_threshold_lr
    dtype: torch.dtype  # of the dense products: bfloat16 under sae.autocast

    @classmethod
    def of(cls, sae, autocast: bool) -> StepSpec:
        cfg = sae.cfg
        return cls(
            batchtopk=cfg.architecture() == "batchtopk",
            k=cfg.k,
            k_aux=cfg.d_in // 2,
            aux_coefficient=cfg.aux_loss_coefficient,
            apply_b_dec_to_input=bool(cfg.apply_b_dec_to_input),
            rescale=bool(cfg.rescale_acts_by_decoder_norm),
            threshold_lr=getattr(cfg, "topk_threshold_lr", 0.0),
            dtype=torch.bfloat16 if autocast else torch.float32,
        )


@dataclass
class StepResult:
    grads: tuple[torch.Tensor, ...]  # float32, PARAMS' order, stacked
    mse: torch.Tensor  # [M]
    aux: torch.Tensor  # [M]
    sae_out: torch.Tensor  # [M, batch, d_out]
    tokens: torch.Tensor  # [M, n] token of each selected entry
    latents: torch.Tensor  # [M, n] latent of each selected entry
    acts: torch.Tensor  # [M, n] SAELens's feature_acts there (ReLU'd, decoder-norm scaled)
    scores: torch.Tensor  # [M, n] SAELens's hidden_pre there (decoder-norm scaled)


def _entries_of_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """TopK: each token's k highest scores; (flat [batch * d_sae] index, value), [M, batch * k]."""
    m, batch, d_sae = scores.shape
    values, latents = scores.topk(k, dim=-1, sorted=False)
    rows = torch.arange(batch, device=scores.device).mul_(d_sae).view(1, batch, 1)
    return (latents + rows).view(m, -1), values.view(m, -1)


def _entries_of_batchtopk(scores: torch.Tensor, k: float) -> tuple[torch.Tensor, torch.Tensor]:
    """BatchTopK: the batch's int(k * batch) highest ReLU'd scores (SAELens's BatchTopK)."""
    m, batch, _ = scores.shape
    values, flat = scores.relu().view(m, -1).topk(int(k * batch), dim=-1, sorted=False)
    return flat, values


def _scatter(flat: torch.Tensor, values: torch.Tensor, shape: Sequence[int], dtype) -> torch.Tensor:
    """The entries as a dense [M, batch, d_sae] matrix (zeros elsewhere); `flat` holds each
    member's entries once, so the result does not depend on the order of writes."""
    m = flat.shape[0]
    out = torch.zeros(m, shape[1] * shape[2], dtype=dtype, device=flat.device)
    return out.scatter_(1, flat, values.to(dtype)).view(*shape)


def _hidden_pre(pre: torch.Tensor, b_enc: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """SAELens's hidden_pre, x W_enc + b_enc, at the entries `flat`, in float32."""
    m, _, d_sae = pre.shape
    return pre.view(m, -1).gather(1, flat).float() + b_enc.gather(1, flat % d_sae)


@torch.no_grad()
def forward_backward(
    weights: Sequence[torch.Tensor],
    x: torch.Tensor,
    target: torch.Tensor,
    dead: torch.Tensor | None,
    spec: StepSpec,
    rows: int | None = None,
) -> StepResult:
    """SAELens's TopK/BatchTopK training loss of each member and its gradients.

    `weights`: the stacked W_enc [M, d_in, d_sae], b_enc [M, d_sae], W_dec [M, d_sae, d_out],
    b_dec [M, d_out]; `x` [M, batch, d_in] the (scaled) inputs and `target` [M, batch, d_out]
    what the outputs are compared with (x for an SAE); `dead` [M, d_sae] the dead latents, or
    None where none can be dead (AuxK skipped); `rows`: the rows the losses are means over
    (the whole batch's, when this is one micro-batch of it).
    """
    W_enc, b_enc, W_dec, b_dec = weights
    m, batch, _ = x.shape
    d_sae = W_enc.shape[-1]
    rows = rows or batch
    cd = spec.dtype
    W_enc_c, W_dec_c = W_enc.to(cd), W_dec.to(cd)
    xc = x - b_dec.unsqueeze(1) if spec.apply_b_dec_to_input else x
    xc_c = xc.to(cd)
    pre = torch.bmm(xc_c, W_enc_c)  # x W_enc; b_enc is added below, with the norms
    norms = W_dec.norm(dim=-1) if spec.rescale else torch.ones_like(b_enc)
    # SAELens's hidden_pre (x W_enc + b_enc) times the decoder norms, in float32.
    scores = torch.addcmul((b_enc * norms).unsqueeze(1), pre, norms.unsqueeze(1))
    if spec.batchtopk:
        flat, values = _entries_of_batchtopk(scores, spec.k)
    else:
        flat, values = _entries_of_topk(scores, int(spec.k))
    latents = flat % d_sae
    aux_flat = None
    if dead is not None:
        masked = scores.masked_fill_(~dead.unsqueeze(1), float("-inf"))  # scores are done
        aux_flat, aux_values = _entries_of_topk(masked, min(spec.k_aux, d_sae))
        del masked
        aux_valid = aux_values > float("-inf")  # past the dead count: weight 0
    del scores

    # The decoder reads SAELens's activation over the decoder norm: the ReLU'd hidden_pre;
    # AuxK's is not ReLU'd.
    h = _hidden_pre(pre, b_enc, flat)
    weights_aux = (
        _hidden_pre(pre, b_enc, aux_flat).mul_(aux_valid) if aux_flat is not None else None
    )
    del pre
    shape = (m, batch, d_sae)
    A = _scatter(flat, h.relu(), shape, cd)
    sae_out = torch.bmm(A, W_dec_c).float() + b_dec.unsqueeze(1)
    diff = sae_out - target
    mse = diff.pow(2).sum(-1).sum(-1) / rows
    g = diff.mul_(2.0 / rows)  # d mse / d sae_out (diff is not needed again)

    # Backward of the decoder: W_dec's gradient and the selected weights' (g W_dec^T there).
    W_dec_t = W_dec_c.transpose(1, 2)
    grad_W_dec = torch.bmm(A.transpose(1, 2), g.to(cd)).float()
    del A
    grad_h = torch.bmm(g.to(cd), W_dec_t).view(m, -1).gather(1, flat).float()
    grad_h = grad_h.mul_(h > 0)  # through the ReLU
    aux = torch.zeros_like(mse)
    if aux_flat is not None:
        n_dead = dead.sum(-1).float()
        scale = (n_dead / spec.k_aux).clamp_(max=1.0)
        A_aux = _scatter(aux_flat, weights_aux, shape, cd)
        residual = target - sae_out
        aux_err = torch.bmm(A_aux, W_dec_c).float().sub_(residual)
        aux = spec.aux_coefficient * scale * aux_err.pow(2).sum(-1).sum(-1) / rows
        ga = aux_err.mul_((2.0 * spec.aux_coefficient / rows) * scale.view(m, 1, 1))
        grad_W_dec = grad_W_dec + torch.bmm(A_aux.transpose(1, 2), ga.to(cd)).float()
        del A_aux
        grad_aux = torch.bmm(ga.to(cd), W_dec_t).view(m, -1).gather(1, aux_flat).float()
        grad_aux = grad_aux.mul_(aux_valid)

    # Backward of the encoder: the gradient at the selected pre-activations, dense, in float32
    # (b_enc's is its column sums, as SAELens's autocast computes it: from float32 values).
    G = torch.zeros(m, batch * d_sae, device=x.device).scatter_(1, flat, grad_h)
    if aux_flat is not None:
        G.scatter_add_(1, aux_flat, grad_aux)  # an entry may be in both: two terms, one order
    G = G.view(shape)
    grad_b_enc = G.sum(1)
    grad_W_enc = torch.bmm(xc_c.transpose(1, 2), G.to(cd)).float()
    del G
    grad_b_dec = g.sum(1)
    if spec.apply_b_dec_to_input:  # x - b_dec feeds the encoder: -(sum of G) W_enc^T
        grad_b_dec = grad_b_dec - torch.bmm(grad_b_enc.unsqueeze(1), W_enc.transpose(1, 2))[:, 0]

    return StepResult(
        grads=(grad_W_enc, grad_b_enc, grad_W_dec, grad_b_dec),
        mse=mse,
        aux=aux,
        sae_out=sae_out,
        tokens=flat // d_sae,
        latents=latents,
        acts=values.relu(),
        scores=values,
    )


def clip_grad_norms_(grads: Sequence[torch.Tensor], max_norm: float = 1.0) -> None:
    """torch.nn.utils.clip_grad_norm_ on each member's gradients (SAELens clips each SAE's to
    norm 1), on the device: no host read."""
    m = grads[0].shape[0]
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(m, -1), dim=1) for g in grads], 1)
    total = torch.linalg.vector_norm(norms, dim=1)
    coef = (max_norm / (total + 1e-6)).clamp_(max=1.0)
    for g in grads:
        g.mul_(coef.view(m, *[1] * (g.dim() - 1)))


# --- host reads that never wait -------------------------------------------------------------------
class HostReads:
    """Device values read on the host without waiting for the device: `put` starts a
    non-blocking copy into pinned host memory (a ring of `slots`); `latest` is the newest copy
    that has landed, as Python numbers, with the step it was taken at. On CPU a copy lands at
    once."""

    def __init__(self, device: torch.device, shape: tuple[int, ...], slots: int = 4):
        self.cuda = device.type == "cuda"
        self.host = [torch.zeros(shape, pin_memory=self.cuda) for _ in range(slots)]
        self.events: list[torch.cuda.Event | None] = [None] * slots
        self.steps = [-1] * slots
        self.next = 0
        self.landed: tuple[int, float | list] | None = None

    def put(self, value: torch.Tensor, step: int) -> None:
        """Copy `value` (taken at `step`) to the host; skipped while the slot's last copy is
        still in flight (never waits)."""
        slot = self.next
        if self.events[slot] is not None and not self.events[slot].query():
            return
        self._collect()
        self.host[slot].copy_(value.detach(), non_blocking=self.cuda)
        self.steps[slot] = step
        self.next = (slot + 1) % len(self.host)
        if self.cuda:
            self.events[slot] = torch.cuda.Event()
            self.events[slot].record()
        else:
            self.landed = (step, self.host[slot].tolist())

    def _collect(self) -> None:
        for slot, event in enumerate(self.events):
            if event is not None and event.query():
                if self.landed is None or self.steps[slot] > self.landed[0]:
                    self.landed = (self.steps[slot], self.host[slot].tolist())
                self.events[slot] = None

    def latest(self) -> tuple[int, float | list] | None:
        self._collect()
        return self.landed


# --- the stack ------------------------------------------------------------------------------------
class Stack:
    """M training SAEs (or transcoders) of one shape trained as one.

    Their parameters become views into stacked float32 tensors (the master weights), so
    SAELens's modules, saving and state dicts work on them unchanged, and one fused Adam steps
    the stack. Firing statistics (steps since each latent fired, firing counts) and BatchTopK's
    thresholds are stacked the same way; member trainers (sae.stacked_trainer) read theirs.
    """

    def __init__(self, saes: Sequence, cfg: SAETrainerConfig, autocast: bool):
        first = saes[0]
        shapes = {tuple(getattr(s, p).shape for p in PARAMS) for s in saes}
        kinds = {(s.cfg.architecture(), is_transcoder(s), StepSpec.of(s, autocast)) for s in saes}
        if len(shapes) > 1 or len(kinds) > 1:
            raise ValueError("a stack holds dictionaries of one shape, kind and config")
        if first.cfg.normalize_activations not in ("none", "expected_average_only_in"):
            raise ValueError("the gpu trainer needs inputs scaled outside the SAE")
        self.saes = list(saes)
        self.spec = StepSpec.of(first, autocast)
        self.transcoder = is_transcoder(first)
        self.d_in = int(first.cfg.d_in)
        self.window = cfg.dead_feature_window
        self.params = []
        with torch.no_grad():
            for name in PARAMS:
                stacked = nn.Parameter(torch.stack([getattr(s, name).detach() for s in saes]))
                for i, s in enumerate(saes):
                    getattr(s, name).data = stacked.data[i]  # the member's is a view
                self.params.append(stacked)
            self.thresholds = None
            if self.spec.batchtopk:
                self.thresholds = torch.stack([s.topk_threshold for s in saes])
                for i, s in enumerate(saes):
                    s.topk_threshold = self.thresholds[i]  # buffers too
        device, d_sae = self.params[0].device, first.cfg.d_sae
        self.device = device
        self.since_fired = torch.zeros(len(saes), d_sae, device=device)
        self.act_freq = torch.zeros(len(saes), d_sae, device=device)
        self.optimizer = torch.optim.Adam(
            self.params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), fused=True
        )
        self.lr_scheduler = get_lr_scheduler(
            cfg.lr_scheduler_name, lr=cfg.lr, optimizer=self.optimizer,
            warm_up_steps=cfg.lr_warm_up_steps, decay_steps=cfg.lr_decay_steps,
            training_steps=cfg.total_training_steps, lr_end=cfg.lr_end,
            num_cycles=cfg.n_restart_cycles,
        )  # fmt: skip
        self.steps = 0  # steps taken by this stack object (the lagged reads count in these)
        self.max_since = HostReads(device, ())
        self.losses = HostReads(device, (2, len(saes)))
        self.max_since.landed = (-1, 0.0)  # a fresh run: nothing has had time to die
        self.pending: list[torch.Tensor | None] = [None] * len(saes)
        self.result: StepResult | None = None  # the last step's
        self.skip_aux = True  # False: AuxK always runs (tests compare the two)

    def __len__(self) -> int:
        return len(self.saes)

    # --- state ------------------------------------------------------------------------------------
    def restored(self) -> None:
        """After steps since firing were set (a new or resumed run): the lagged reading starts
        from them, read once, here, outside the steady state."""
        self.max_since.landed = (self.steps - 1, float(self.since_fired.amax()))

    def member_optimizer_state(self, i: int) -> dict:
        """Member i's part of the stack's Adam state, as torch's Adam.state_dict() of its own
        four parameters would hold it (so checkpoints are those of a one-SAE trainer)."""
        state = {}
        for j, p in enumerate(self.params):
            s = self.optimizer.state.get(p)
            if s:
                state[j] = {"step": s["step"], "exp_avg": s["exp_avg"][i],
                            "exp_avg_sq": s["exp_avg_sq"][i]}  # fmt: skip
        group = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        return {"state": state, "param_groups": [group | {"params": list(range(len(PARAMS)))}]}

    def load_member_optimizer_state(self, i: int, sd: dict) -> None:
        for j, p in enumerate(self.params):
            s = sd["state"].get(j) or sd["state"].get(str(j))
            if not s:
                continue
            mine = self.optimizer.state[p]
            if not mine:  # Adam makes its state at its first step: a resumed run's is loaded
                zeros = torch.zeros_like(p)
                mine.update(step=torch.zeros((), device=self.device), exp_avg=zeros,
                            exp_avg_sq=zeros.clone())  # fmt: skip
            mine["step"].copy_(torch.as_tensor(s["step"]))
            mine["exp_avg"][i].copy_(s["exp_avg"])
            mine["exp_avg_sq"][i].copy_(s["exp_avg_sq"])
        for k, v in sd["param_groups"][0].items():
            if k != "params":
                self.optimizer.param_groups[0][k] = v

    def loss_description(self, i: int | None = None) -> str:
        """The progress bar's losses of member i (every member's when None), from the newest
        step whose losses have landed on the host."""
        landed = self.losses.latest()
        if landed is None:
            return "losses on their way"
        step, (mse, aux) = landed
        members = range(len(self)) if i is None else [i]
        return f"{step}| " + " | ".join(
            f"mse_loss: {mse[j]:.5f} | auxiliary_reconstruction_loss: {aux[j]:.5f}" for j in members
        )

    # --- the step ---------------------------------------------------------------------------------
    def submit(self, i: int, batch: torch.Tensor) -> bool:
        """Member i's scaled batch for this step; True when every member's is in (then `run`)."""
        self.pending[i] = batch
        return all(b is not None for b in self.pending)

    def dead_or_none(self) -> torch.Tensor | None:
        """The dead latents for AuxK, or None when the lagged reading proves none dead."""
        reading = self.max_since.latest() if self.skip_aux else None
        if reading is not None:
            taken, most = reading
            if most + (self.steps - 1 - taken) <= self.window:
                return None
        return self.since_fired > self.window

    def run(self, backoff) -> StepResult:
        """One step of every member on the submitted batches; after an out-of-memory error
        `backoff` (memory.OOMBackoff) redoes it over micro-batches of half the rows, as
        SAELens's trainer does in ControlledSAETrainer (gradients summed, each part's losses
        already over the whole batch's rows; BatchTopK's threshold moved per part)."""
        batch = torch.stack(self.pending) if len(self) > 1 else self.pending[0].unsqueeze(0)
        self.pending = [None] * len(self)
        d = self.d_in
        x, target = (batch[..., :d], batch[..., d:]) if self.transcoder else (batch, batch)
        dead = self.dead_or_none()
        weights = [p.detach() for p in self.params]
        rows = x.shape[1]

        def attempt(size: int) -> list[StepResult]:
            return [forward_backward(weights, x[:, a : a + size], target[:, a : a + size], dead,
                                     self.spec, rows) for a in range(0, rows, size)]  # fmt: skip

        parts = backoff.run(attempt)
        for part in parts:
            self._move_threshold(part)
        result = parts[0] if len(parts) == 1 else _join(parts)
        self._record_firing(result)
        clip_grad_norms_(result.grads)
        for p, grad in zip(self.params, result.grads, strict=True):
            p.grad = grad
        self.optimizer.step()
        for p in self.params:
            p.grad = None
        self.lr_scheduler.step()
        self.losses.put(torch.stack([result.mse, result.aux]), self.steps)
        self.max_since.put(self.since_fired.amax(), self.steps)
        self.result = result
        self.steps += 1
        return result

    @torch.no_grad()
    def _record_firing(self, r: StepResult) -> None:
        """SAETrainer's firing statistics, on the device."""
        counts = torch.zeros_like(self.act_freq).scatter_add_(1, r.latents, (r.acts > 0).float())
        self.act_freq += counts
        self.since_fired = torch.where(counts > 0, 0.0, self.since_fired + 1)

    @torch.no_grad()
    def _move_threshold(self, r: StepResult) -> None:
        """BatchTopKTrainingSAE.update_topk_threshold: an average of the lowest firing
        activation, left alone when none fired; on the device."""
        if self.thresholds is None:
            return
        lowest = torch.where(r.acts > 0, r.acts, float("inf")).amin(1).double()
        moved = (1 - self.spec.threshold_lr) * self.thresholds + self.spec.threshold_lr * lowest
        self.thresholds.copy_(torch.where(lowest.isfinite(), moved, self.thresholds))


def _join(parts: list[StepResult]) -> StepResult:
    """One step's result from its micro-batches' (gradients and losses summed: each part's are
    already over the whole batch's rows; entries renumbered to the whole batch's tokens)."""
    tokens, start = [], 0
    for p in parts:
        tokens.append(p.tokens + start)
        start += p.sae_out.shape[1]
    return StepResult(
        grads=tuple(sum(gs) for gs in zip(*(p.grads for p in parts), strict=True)),
        mse=sum(p.mse for p in parts),
        aux=sum(p.aux for p in parts),
        sae_out=torch.cat([p.sae_out for p in parts], 1),
        tokens=torch.cat(tokens, 1),
        latents=torch.cat([p.latents for p in parts], 1),
        acts=torch.cat([p.acts for p in parts], 1),
        scores=torch.cat([p.scores for p in parts], 1),
    )
