"""Training cross-layer transcoders (sae.cross_layer's CrossLayerTranscoder), features sharded
over torch.distributed ranks; a library core with no pipeline rule yet.

The data is every layer's MLP input x [B, L, D] and MLP output y [B, L, D] for a batch of B
tokens. The objective's reconstruction term is the sum over target layers t of the normalised
MSE  sum_b |y_hat[b, t] - y[b, t]|^2 / sum_b |y[b, t] - mean_b y[b, t]|^2  (the batch's own
variance, so every layer counts alike whatever its scale: MLP outputs grow with depth), in
float32. On top of it, by activation:

- TopK / BatchTopK: nothing but AuxK (Gao et al. 2024), as the per-layer trainers (sae.fast,
  sae.stacked) do it: a feature is dead when it has not fired for `dead_window` steps; each token
  gets, for each source layer, its k_aux = D // 2 highest pre-activations among the dead features
  (sae.auxk.aux_size's rule; not ReLU'd, as SAELens's), which are decoded into every target layer
  to predict the live features' residual; the loss, the same normalised MSE, is scaled by
  min(dead / (L * k_aux), 1) and `aux_coefficient`. Features are chosen on the raw
  pre-activations, as CrossLayerTranscoder.activate chooses them at inference (no decoder-norm
  rescaling), so the trained model runs as trained.
- JumpReLU: the circuit-tracing methods paper's (Ameisen et al. 2025) penalties, with |W_dec_f|
  the norm of feature f's decoder vectors into all its target layers, concatenated:
  `sparsity_coefficient` * sum_f tanh(`tanh_scale` * a_f * |W_dec_f|) (a smooth L0) and
  `preact_coefficient` * sum_f ReLU(threshold_f - pre_f) * |W_dec_f| (pulls features that never
  fire back towards their threshold), both means over tokens and sums over layers and features.
  The threshold (held as its log, so it stays positive) learns through the JumpReLU's
  straight-through estimator with a rectangle kernel of width `bandwidth` (Rajamanoharan et al.
  2024): d a / d threshold = -(threshold / bandwidth) where |pre - threshold| < bandwidth / 2.

Sharding: with R ranks (a gloo or NCCL process group; none, or R = 1, is the same code), rank r
holds features [r F / R, (r + 1) F / R) of every layer's encoder, threshold and decoder, and b_dec
whole. Every rank sees the whole batch. Each computes its features' partial reconstruction; an
all_reduce sums the partials (its backward is the identity: every rank then computes the same
loss on the same sum, so the gradient reaching each partial is already the whole one); b_dec is
added after the sum, once, so its gradient is the same on every rank with no reduction. TopK
over the sharded features is global: each rank sends its k best (score, feature) candidates
(all_gather), every rank picks the same k-th best, ties going to the lower global feature index
(so exactly k features a token, the same ones at any R), and keeps its own features at or above
it. The penalties are sums over features: each rank's gradient needs only its own terms, and the
loss reported is all_reduced.

The step never reads a device value back (tests/helpers/no_sync.py proves it on CPU), so on a
GPU it queues without waiting: AuxK takes a fixed k_aux picks a token with the live features
masked to -inf (a pick past a layer's dead count is -inf and dropped: min(k_aux, dead) picks,
as SAELens), its scale stays on the device, and with nothing dead it adds exact zeros; it is
skipped, exactly, while no feature can be dead yet (steps since firing grow by one a step at
most, read once at the start and on resume), and the losses are read back at checkpoints and
at the end only.

Checkpoints (sae.checkpoint: safetensors + JSON, atomic, checksummed; no pickle) are per rank,
under {root}/rank_{r:03d}/step_{n:09d}; a resume takes the newest step every rank has, so one
that stopped mid-write resumes from the step before. Adam's moments are in the checkpoint, the
data position is the step count (the caller's batches are skipped up to it), and nothing else
is random after initialisation, so on CPU a resumed run equals an uninterrupted one bitwise.
Initialisation draws every layer's full weights from `seed` and keeps the shard's slice, so the
model at step 0 is the same at any R.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from circuitflow.sae.checkpoint import (
    list_checkpoints,
    load_checkpoint,
    optimizer_from_flat,
    optimizer_to_flat,
    save_checkpoint,
)
from circuitflow.sae.cross_layer import CrossLayerTranscoder
from circuitflow.sae.metrics import constant_target

TRAINABLE = ("topk", "batchtopk", "jumprelu")


@dataclass(frozen=True)
class CLTTrainConfig:
    """How to train a CLT. `steps` is the total; it enters nothing but the loop's end, so a run
    with fewer steps is an exact prefix of a longer one (and resuming may raise it)."""

    d_transcoder: int  # F, features a layer
    activation: str = "topk"  # one of TRAINABLE
    k: int = 4  # TopK's k a token, BatchTopK's mean k a token, every layer
    lr: float = 1e-3
    steps: int = 1000
    seed: int = 0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    # AuxK (TopK, BatchTopK): Gao et al.'s coefficient 1/32; dead after this many steps unfired.
    aux_coefficient: float = 1 / 32
    dead_window: int = 100
    # JumpReLU: see the module's doc. The threshold and bandwidth are in pre-activation units.
    sparsity_coefficient: float = 1e-2
    tanh_scale: float = 4.0
    preact_coefficient: float = 3e-6
    initial_threshold: float = 0.1
    bandwidth: float = 0.1
    checkpoint_every: int = 0  # steps; 0: only at the end (when a checkpoint folder is given)

    def __post_init__(self) -> None:
        if self.activation not in TRAINABLE:
            raise ValueError(f"activation {self.activation!r}: one of {', '.join(TRAINABLE)}")
        if self.activation != "jumprelu" and not 0 < self.k <= self.d_transcoder:
            raise ValueError(f"k {self.k}: in 1..{self.d_transcoder}")

    def as_json(self) -> dict:
        return {**asdict(self), "adam_betas": list(self.adam_betas)}


@dataclass
class TrainResult:
    """`clt`: the full model (on rank 0; None on the others). Per-layer metrics of the last
    step's batch, float64 lists: `nmse` (reconstruction of each target layer; None where its
    target is constant: nothing to explain), `l0` (features a token, each source layer),
    `dead_fraction` (each layer's features dead, of all ranks');
    `losses`: the total loss of every step of this run and the runs it resumed."""

    clt: CrossLayerTranscoder | None
    step: int
    losses: list[float]
    nmse: list[float | None]
    l0: list[float]
    dead_fraction: list[float]


# --- the process group, or none ---------------------------------------------------------------
def world() -> tuple[int, int]:
    """(rank, world size): (0, 1) with no process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_reduce(t: torch.Tensor, op=None) -> torch.Tensor:
    if world()[1] > 1:
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t


def _all_gather(t: torch.Tensor) -> list[torch.Tensor]:
    if world()[1] == 1:
        return [t]
    t = t.contiguous()
    out = [torch.empty_like(t) for _ in range(world()[1])]
    dist.all_gather(out, t)
    return out


class _SumOverRanks(torch.autograd.Function):
    """all_reduce(sum) whose backward is the identity: every rank computes the same loss from
    the sum, so d loss / d sum, identical on every rank, is each partial's gradient."""

    @staticmethod
    def forward(ctx, partial):
        return _all_reduce(partial.clone())

    @staticmethod
    def backward(ctx, grad):
        return grad


# --- choosing features over the shards -----------------------------------------------------------
@torch.no_grad()
def global_topk_mask(scores: torch.Tensor, index: torch.Tensor, k: int) -> torch.Tensor:
    """Which of this rank's entries are among the k best of all ranks', along the last dim:
    `scores` [..., n] this rank's, `index` [n] their global ids, ascending (ties go to the lower
    id, so exactly k are chosen over all ranks where k are finite; -inf is never chosen). The
    result, bool [..., n], is the same for the same global scores at any number of ranks."""
    n = scores.shape[-1]
    kk = min(k, n)
    # A stable descending sort keeps equal scores in index order: this rank's best kk candidates.
    values, pos = torch.sort(scores, dim=-1, descending=True, stable=True)
    values, ids = values[..., :kk], index.expand_as(scores).gather(-1, pos[..., :kk])
    values, ids = torch.cat(_all_gather(values), -1), torch.cat(_all_gather(ids), -1)
    # Order all candidates by (score desc, id asc): by id, then stably by score.
    by_id = ids.argsort(dim=-1, stable=True)
    values, ids = values.gather(-1, by_id), ids.gather(-1, by_id)
    order = values.argsort(dim=-1, descending=True, stable=True)[..., k - 1 : k]
    kth_value, kth_id = values.gather(-1, order), ids.gather(-1, order)
    mine = index.expand_as(scores)
    chosen = (scores > kth_value) | ((scores == kth_value) & (mine <= kth_id))
    return chosen & (scores > float("-inf"))


# --- one rank's share of the model ----------------------------------------------------------------
class CLTShard(torch.nn.Module):
    """Rank `rank`'s features [rank F / R, (rank + 1) F / R) of every layer (float32 master
    weights), and b_dec whole. Parameter order (Adam's, the checkpoint's) is fixed."""

    def __init__(self, n_layers: int, d_model: int, cfg: CLTTrainConfig) -> None:
        super().__init__()
        rank, size = world()
        F = cfg.d_transcoder  # noqa: N806 - the maths' names
        if F % size:
            raise ValueError(f"d_transcoder {F} does not split over {size} ranks")
        L, D, Fr = n_layers, d_model, F // size  # noqa: N806
        self.n_layers, self.d_model, self.cfg = L, D, cfg
        self.lo, self.hi = rank * Fr, (rank + 1) * Fr
        gen = torch.Generator().manual_seed(cfg.seed)
        # The circuit-tracing paper's initialisation: encoder U(+-1/sqrt(F)), decoders
        # U(+-1/sqrt(L D)); each full [F, D] matrix drawn in turn and sliced, so any R agrees.

        def uniform(bound: float) -> torch.Tensor:
            full = (torch.rand(F, D, generator=gen, dtype=torch.float64) * 2 - 1) * bound
            return full[self.lo : self.hi].to(torch.float32)

        self.W_enc = torch.nn.Parameter(torch.stack([uniform(F**-0.5) for _ in range(L)]))
        self.b_enc = torch.nn.Parameter(torch.zeros(L, Fr))
        self.b_dec = torch.nn.Parameter(torch.zeros(L, D))
        self.log_threshold = (
            torch.nn.Parameter(torch.full((L, Fr), math.log(cfg.initial_threshold)))
            if cfg.activation == "jumprelu"
            else None
        )
        self.W_dec = torch.nn.ParameterList(
            torch.nn.Parameter(torch.stack([uniform((L * D) ** -0.5) for _ in range(i, L)], dim=1))
            for i in range(L)
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """The parameters by name, in Adam's order."""
        return dict(self.named_parameters())

    def decoder_norms(self) -> torch.Tensor:
        """|W_dec_f| over all of f's target layers [L, F_r]."""
        return torch.stack([w.flatten(1).norm(dim=1) for w in self.W_dec])

    def decode_partial(self, acts: torch.Tensor) -> torch.Tensor:
        """This shard's features' part of every target layer's reconstruction, [B, L, D]
        float32, no b_dec: target t gets sum over sources i <= t of acts[:, i] W_dec[i][:, t-i]."""
        L = self.n_layers  # noqa: N806
        acc = [acts.new_zeros(acts.shape[0], self.d_model) for _ in range(L)]
        for i in range(L):
            written = torch.einsum("bf,ftd->tbd", acts[:, i], self.W_dec[i])
            for t in range(i, L):
                acc[t] = acc[t] + written[t - i]
        return torch.stack(acc, dim=1)


class _JumpReLU(torch.autograd.Function):
    """pre * (pre > threshold), with the rectangle-kernel straight-through estimator for the
    threshold (its true gradient is zero almost everywhere)."""

    @staticmethod
    def forward(ctx, pre, threshold, bandwidth: float):
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold)

    @staticmethod
    def backward(ctx, grad):
        pre, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        near = ((pre - threshold).abs() < eps / 2).to(grad.dtype)
        grad_threshold = (-(threshold / eps) * near * grad).sum(0)  # over the batch
        return grad * (pre > threshold), grad_threshold, None


def _layer_errors(pred: torch.Tensor, target: torch.Tensor):
    """Each target layer's squared error and variance [L] of [B, L, D] (float32 sums), and
    whether its target is constant (an MLP that writes nothing: metrics.constant_target)."""
    err = (pred - target).pow(2).sum((0, 2))
    var = (target - target.mean(0, keepdim=True)).pow(2).sum((0, 2))
    return err, var, constant_target(var, target.pow(2).sum((0, 2)))


def _nmse(pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The objective's terms: each target layer's normalised MSE [L] of [B, L, D] (float32), and
    which layers' targets are constant [L] (bool). A layer whose target has no variance is
    normalised by the other layers' mean variance (by 1 where all are constant): its error
    still counts, and nothing divides by zero. Without a branch on the host, so a GPU step does
    not wait for it."""
    err, var, const = _layer_errors(pred, target)
    varied = (~const).to(var.dtype)
    n_varied = varied.sum()
    scale = (var * varied).sum() / n_varied.clamp_min(1)
    scale = torch.where(n_varied > 0, scale, torch.ones_like(scale))
    return err / torch.where(const, scale, var), const


def _reported_nmse(pred: torch.Tensor, target: torch.Tensor) -> list[float | None]:
    """Each target layer's normalised MSE (float64), None where the target is constant: there
    is no variance to explain (as metrics.ReconstructionStats reports a per-layer dictionary)."""
    err, var, const = _layer_errors(pred, target)
    return _unless_constant((err.double() / var.double()).tolist(), const.tolist())


def _unless_constant(values: list[float], constant: list[bool]) -> list[float | None]:
    return [None if c else v for v, c in zip(values, constant, strict=True)]


@dataclass
class StepOutput:
    loss: torch.Tensor  # the whole objective (all ranks' terms), detached
    nmse: torch.Tensor  # [L]
    constant: torch.Tensor  # [L] bool: target layers with no variance (nmse undefined)
    l0: torch.Tensor  # [L], all ranks' features
    fired: torch.Tensor  # [L, F_r] bool: this rank's features that fired in the batch
    terms: dict[str, torch.Tensor] = field(default_factory=dict)  # each detached, on the device


def training_step(
    shard: CLTShard, x: torch.Tensor, y: torch.Tensor, dead: torch.Tensor | None
) -> tuple[torch.Tensor, StepOutput]:
    """The objective (this rank's differentiable loss) and what it measured, for a batch of MLP
    inputs x and outputs y [B, L, D]; `dead` [L, F_r] this rank's dead features (AuxK), or None.
    Backward on the loss gives this rank's gradients; call it on every rank with the same batch."""
    cfg = shard.cfg
    x, y = x.to(torch.float32), y.to(torch.float32)
    B, L, _ = x.shape  # noqa: N806
    F, Fr = cfg.d_transcoder, shard.hi - shard.lo  # noqa: N806
    pre = torch.einsum("bld,lfd->blf", x, shard.W_enc) + shard.b_enc  # [B, L, F_r]
    features = torch.arange(shard.lo, shard.hi, device=pre.device)
    if cfg.activation == "topk":
        acts = pre.relu() * global_topk_mask(pre, features, cfg.k)
    elif cfg.activation == "batchtopk":
        # Over the batch and the features of each layer: entry (b, f) is global id b F + f.
        flat = pre.detach().relu().transpose(0, 1).reshape(L, B * Fr)
        ids = (torch.arange(B, device=pre.device)[:, None] * F + features[None, :]).reshape(-1)
        mask = global_topk_mask(flat, ids, cfg.k * B).reshape(L, B, Fr).transpose(0, 1)
        acts = pre.relu() * mask
    else:
        threshold = shard.log_threshold.exp()
        acts = _JumpReLU.apply(pre, threshold, cfg.bandwidth)
    recon = _SumOverRanks.apply(shard.decode_partial(acts)) + shard.b_dec
    nmse, constant = _nmse(recon, y)
    loss = nmse.sum()
    terms: dict[str, torch.Tensor] = {"reconstruction": loss.detach()}
    if cfg.activation == "jumprelu":
        norms = shard.decoder_norms()
        tanh = torch.tanh(cfg.tanh_scale * acts * norms).sum((1, 2)).mean()
        preact = ((threshold - pre).relu() * norms).sum((1, 2)).mean()
        local = cfg.sparsity_coefficient * tanh + cfg.preact_coefficient * preact
        loss = loss + local
        terms["penalties"] = _all_reduce(local.detach().clone())
    elif dead is not None:
        # sae.auxk's rule without reading the dead count back: a fixed k_aux = D // 2 picks a
        # token and layer among the dead features (the live ones -inf, never picked, so
        # min(k_aux, dead) of them), and the scale min(dead / (L k_aux), 1) over all ranks' and
        # layers' dead features on the device: nothing dead adds exact zeros.
        k_aux = shard.d_model // 2
        n_dead = _all_reduce(dead.sum().reshape(1).to(torch.float32))
        scale = (n_dead / (L * k_aux)).clamp(max=1.0)
        scores = pre.detach().masked_fill(~dead, float("-inf"))
        aux_acts = pre * global_topk_mask(scores, features, min(k_aux, F))
        residual = (y - recon).detach()
        aux_recon = _SumOverRanks.apply(shard.decode_partial(aux_acts))
        aux = (cfg.aux_coefficient * scale * _nmse(aux_recon, residual)[0].sum()).squeeze(0)
        loss = loss + aux
        terms["aux"] = aux.detach()
    with torch.no_grad():
        active = acts.detach() != 0
        l0 = _all_reduce(active.sum((0, 2)).to(torch.float32)) / B
        total = sum(terms.values())
    out = StepOutput(
        loss=total, nmse=nmse.detach(), constant=constant, l0=l0, fired=active.any(0),
        terms=terms,
    )  # fmt: skip
    return loss, out


# --- the loop -------------------------------------------------------------------------------------
def shuffled_batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless batches of rows of x, y [N, L, D], each epoch in a fresh order drawn from `seed`
    (the same sequence every time: a resumed run skips the batches it has trained on)."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(x), generator=gen)
        for start in range(0, len(x) - batch_size + 1, batch_size):
            rows = order[start : start + batch_size]
            yield x[rows], y[rows]


def _rank_dir(root: Path) -> Path:
    return Path(root) / f"rank_{world()[0]:03d}"


def _latest_common_step(root: Path) -> int:
    """The newest checkpoint step every rank has (0: none)."""
    steps = [int(p.name.split("_")[1]) for p in list_checkpoints(_rank_dir(root))]
    mine = torch.tensor([max(steps, default=0)], dtype=torch.int64)
    return int(_all_reduce(mine, dist.ReduceOp.MIN).item())


def _save(root, step, shard, opt, since_fired, losses) -> None:
    rank, size = world()
    opt_tensors, opt_json = optimizer_to_flat(opt.state_dict())
    tensors = {f"param.{k}": v for k, v in shard.tensors().items()}
    tensors |= opt_tensors | {"since_fired": since_fired}
    state = {"config": shard.cfg.as_json(), "rank": rank, "world_size": size,
             "optimizer": opt_json, "losses": losses}  # fmt: skip
    save_checkpoint(_rank_dir(root), step, tensors, state)


def _restore(root, step, shard, opt) -> tuple[torch.Tensor, list[float]]:
    tensors, state = load_checkpoint(_rank_dir(root) / f"step_{step:09d}")
    rank, size = world()
    if state["world_size"] != size or state["rank"] != rank:
        raise ValueError(f"checkpoint {root}: from {state['world_size']} ranks, this is {size}")
    free = ("steps", "checkpoint_every")  # a resumed run may go further, or save more often
    mine = {k: v for k, v in shard.cfg.as_json().items() if k not in free}
    theirs = {k: v for k, v in state["config"].items() if k not in free}
    if mine != theirs:
        raise ValueError(f"checkpoint {root}: another configuration ({theirs})")
    with torch.no_grad():
        for name, p in shard.tensors().items():
            p.copy_(tensors[f"param.{name}"])
    opt.load_state_dict(optimizer_from_flat(tensors, state["optimizer"]))
    return tensors["since_fired"], list(state["losses"])


def train(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    cfg: CLTTrainConfig,
    checkpoint: Path | str | None = None,
    **clt_kwargs,
) -> TrainResult:
    """Train a CLT on `batches` of (x, y) [B, L, D] (each rank the same sequence) for
    `cfg.steps` steps with Adam, this rank's shard of the features (see the module's doc).
    `checkpoint`: a folder to checkpoint into every `cfg.checkpoint_every` steps and at the
    end, and to resume from (its first batches, those trained on, are skipped). `clt_kwargs`
    go to the CrossLayerTranscoder returned (hooks, model_name)."""
    it = iter(batches)
    x0, y0 = next(it)
    it = itertools.chain([(x0, y0)], it)
    L, D = x0.shape[1], x0.shape[2]  # noqa: N806
    shard = CLTShard(L, D, cfg).to(x0.device)  # initialised on the host: the same at any R
    opt = torch.optim.Adam(shard.parameters(), lr=cfg.lr, betas=cfg.adam_betas)
    since_fired = torch.zeros(L, shard.hi - shard.lo, dtype=torch.int64, device=x0.device)
    losses: list[float] = []
    pending: list[torch.Tensor] = []  # this run's losses not read back yet
    step = 0
    if checkpoint is not None:
        step = _latest_common_step(Path(checkpoint))
        if step:
            since_fired, losses = _restore(Path(checkpoint), step, shard, opt)
            since_fired, losses = since_fired.to(x0.device), losses[:step]
    # No feature is dead while the oldest reading of steps since firing (read once, here) plus
    # the steps taken since stays within the window: AuxK is skipped until then, exactly.
    oldest, taken = int(_all_reduce(since_fired.amax().reshape(1), dist.ReduceOp.MAX)), 0
    out = None
    for x, y in itertools.islice(it, step, cfg.steps):
        can_die = cfg.activation != "jumprelu" and oldest + taken > cfg.dead_window
        dead = since_fired > cfg.dead_window if can_die else None
        opt.zero_grad(set_to_none=True)
        loss, out = training_step(shard, x, y, dead)
        loss.backward()
        opt.step()
        since_fired = torch.where(out.fired, 0, since_fired + 1)
        pending.append(out.loss)
        step, taken = step + 1, taken + 1
        every = cfg.checkpoint_every
        if checkpoint is not None and (step == cfg.steps or (every and step % every == 0)):
            losses, pending = losses + torch.stack(pending).tolist(), []
            _save(Path(checkpoint), step, shard, opt, since_fired, losses)
    losses += torch.stack(pending).tolist() if pending else []
    if step < cfg.steps:
        raise ValueError(f"the batches ran out after {step} of {cfg.steps} steps")
    dead = _all_reduce((since_fired > cfg.dead_window).sum(1).to(torch.float64))
    return TrainResult(
        clt=gather_clt(shard, **clt_kwargs),
        step=step,
        losses=losses,
        nmse=_unless_constant(out.nmse.double().tolist(), out.constant.tolist()) if out else [],
        l0=out.l0.double().tolist() if out is not None else [],
        dead_fraction=(dead / cfg.d_transcoder).tolist(),
    )


@torch.no_grad()
def gather_clt(shard: CLTShard, **clt_kwargs) -> CrossLayerTranscoder | None:
    """The whole model from every rank's shard, on rank 0 (None on the others): a collective,
    every rank calls it."""
    cfg = shard.cfg
    rank, size = world()

    def whole(t: torch.Tensor, dim: int) -> torch.Tensor | None:
        if size == 1:
            return t.detach()
        t = t.detach().contiguous()
        parts = [torch.empty_like(t) for _ in range(size)] if rank == 0 else None
        dist.gather(t, parts, dst=0)
        return torch.cat(parts, dim) if rank == 0 else None

    W_enc, b_enc = whole(shard.W_enc, 1), whole(shard.b_enc, 1)  # noqa: N806
    threshold = whole(shard.log_threshold, 1) if shard.log_threshold is not None else None
    W_dec = [whole(w, 0) for w in shard.W_dec]  # noqa: N806
    if rank != 0:
        return None
    k = cfg.k if cfg.activation != "jumprelu" else None
    clt = CrossLayerTranscoder(
        shard.n_layers, shard.d_model, cfg.d_transcoder, activation=cfg.activation, k=k,
        **clt_kwargs,
    )  # fmt: skip
    clt.W_enc.copy_(W_enc)
    clt.b_enc.copy_(b_enc)
    clt.b_dec.copy_(shard.b_dec)
    if threshold is not None:
        clt.threshold.copy_(threshold.exp())
    for i, w in enumerate(W_dec):
        clt.W_dec[i].copy_(w)
    return clt


# --- measuring and exporting ----------------------------------------------------------------------
@torch.no_grad()
def evaluate(clt: CrossLayerTranscoder, x: torch.Tensor, y: torch.Tensor) -> dict[str, list]:
    """A CLT's per-layer `nmse` (each target layer, as the objective's; None where the target is
    constant) and `l0` (features a token, each source layer) on x, y [N, L, D], by its own
    forward pass (float64 lists)."""
    inputs = x.transpose(0, 1).to(clt.dtype)
    features = clt.encode_all(inputs)  # [L, N, F]
    recon = clt.decode(features, inputs).transpose(0, 1)
    return {
        "nmse": _reported_nmse(recon, y.to(torch.float32)),
        "l0": (features != 0).sum(-1).double().mean(1).tolist(),
    }


@torch.no_grad()
def to_jumprelu(clt: CrossLayerTranscoder, x: torch.Tensor) -> CrossLayerTranscoder:
    """A JumpReLU copy of a TopK or BatchTopK CLT (circuit-tracer has no TopK), one threshold a
    layer, calibrated on the sample x [N, L, D] (MLP inputs) so that each layer's mean L0 on it
    is the TopK's: with n = that L0 x N, the threshold sits between the n-th and (n+1)-th
    largest pre-activations over the sample's (token, feature) pairs, so exactly n pass (ties
    apart), and never below 0 (a JumpReLU passes negative pre-activations above a negative
    threshold, which TopK's ReLU does not)."""
    if clt.activation not in ("topk", "batchtopk"):
        raise ValueError(f"to_jumprelu converts TopK or BatchTopK CLTs, not {clt.activation}")
    L, D, F = clt.n_layers, clt.d_model, clt.d_transcoder  # noqa: N806
    out = CrossLayerTranscoder(
        L, D, F, activation="jumprelu", skip=clt.W_skip is not None,
        feature_input_hook=clt.feature_input_hook, feature_output_hook=clt.feature_output_hook,
        model_name=clt.model_name, dtype=clt.dtype, device=clt.device,
    )  # fmt: skip
    for name in ("W_enc", "b_enc", "b_dec", "W_skip"):
        if getattr(clt, name) is not None:
            getattr(out, name).copy_(getattr(clt, name))
    for i in range(L):
        out.W_dec[i].copy_(clt.decoder_rows(i))
    inputs = x.transpose(0, 1).to(clt.device)
    for layer in range(L):
        pre = clt.pre_activations(layer, inputs[layer])
        n = int((clt.activate(layer, pre) != 0).sum())  # the TopK's firings on the sample
        flat = pre.flatten().to(torch.float64).sort(descending=True).values
        if n >= len(flat):
            threshold = 0.0
        else:
            above, below = float(flat[n - 1]) if n else math.inf, float(flat[n])
            threshold = below + (above - below) / 2 if n else below
            # Rounded to the dtype the midpoint may land on `above`; `below` still passes n.
            if torch.tensor(threshold, dtype=out.dtype).item() >= above:
                threshold = below
        out.threshold[layer] = max(threshold, 0.0)
    return out
