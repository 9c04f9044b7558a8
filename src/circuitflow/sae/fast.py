"""The fast trainer for TopK and BatchTopK SAEs (`sae.trainer: fast`), made for CPUs.

It optimises SAELens's objective on SAELens's schedule: the same SAE module (parameters,
initialisation, saving), Adam, learning-rate schedule, gradient clipping, activation scaling,
dead-latent bookkeeping and AuxK loss, because it is SAELens's trainer with one step replaced.
What it leaves out is SAELens's dense work. A TopK SAE uses k of d_sae latents per token, but
SAELens's step multiplies dense [batch, d_sae] matrices six times (encoder, decoder, forward and
backward) and three more for the AuxK loss. Here only the encoder's forward is dense:

- the decoder (`SparseDecoder`) is a gather-sum of the selected rows of W_dec (F.embedding_bag);
  its backward touches only those rows and the selected activations;
- the encoder's backward (`SelectedPreacts`) touches only the selected latents' weights;
- the AuxK loss on dead latents reuses both, for its k_aux latents per token.

All of it is three sparse products (`gather_sum`, `scatter_outer`, `sampled_dot`) on one
`Selection` of (token, latent) entries.

Where this goes past SAELens, with the same maths:

- SAELens scales the pre-activations by the decoder row norms to select latents, then divides the
  activations by the same norms to decode (rescale_acts_by_decoder_norm). The two cancel exactly,
  so the decoder weights here are the pre-activations themselves, and no gradient flows through
  the norms (in SAELens only rounding error does).
- Adam is torch's fused implementation (SAELens's is the per-tensor loop on CPU): the same update
  in one pass over the parameters.
- bf16 autocast (`sae.autocast`) covers the dense encoder matmul only, the one op where it pays;
  the sparse ops, losses and weights stay float32.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F
from sae_lens.saes.sae import TrainStepOutput
from sae_lens.training.optim import get_lr_scheduler

from circuitflow.sae.auxk import aux_size
from circuitflow.sae.trainer import ControlledSAETrainer
from circuitflow.sae.transcoder import split


# --- which latents each token uses ----------------------------------------------------------------
@dataclass
class Selection:
    """The (token, latent) entries of one step as a sparse [bags, d_sae] matrix in CSR layout.

    Bag b holds entries offsets[b]:offsets[b+1], latents ascending (a valid CSR row, and an
    F.embedding_bag bag). A selection covers the batch once per part (the TopK latents, then the
    AuxK latents), so bag p * batch + t is token t's in part p.
    """

    bags: torch.Tensor  # [n] bag of each entry
    latents: torch.Tensor  # [n] latent of each entry
    offsets: torch.Tensor  # [bags] first entry of each bag
    scores: torch.Tensor  # [n] SAELens's hidden_pre (pre-activation x decoder norm), no grad
    d_sae: int

    def __len__(self) -> int:
        return len(self.latents)

    def then(self, other: Selection) -> Selection:
        """This selection's bags followed by `other`'s."""
        return Selection(
            torch.cat([self.bags, other.bags + len(self.offsets)]),
            torch.cat([self.latents, other.latents]),
            torch.cat([self.offsets, other.offsets + len(self)]),
            torch.cat([self.scores, other.scores]),
            self.d_sae,
        )

    @cached_property
    def by_latent(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The transposed matrix's layout: (entry order sorted by latent, first of each latent)."""
        # A [1, n] sort runs single-threaded; torch's 1-D sort took ~250 ms for 32k entries on
        # 2 busy cores (its parallel path), this ~3 ms.
        order = self.latents.view(1, -1).sort(dim=-1, stable=True).indices.squeeze(0)
        counts = torch.bincount(self.latents, minlength=self.d_sae)
        return order, torch.cumsum(counts, 0) - counts

    def pattern(self) -> torch.Tensor:
        """The entries as a CSR matrix of zeros (sampled_addmm's pattern)."""
        end = torch.tensor([len(self)], device=self.offsets.device)
        with warnings.catch_warnings():  # "CSR support is in beta": sampled_addmm needs it
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(
                torch.cat([self.offsets, end]),
                self.latents,
                self.scores.new_zeros(len(self)),
                (len(self.offsets), self.d_sae),
                check_invariants=False,
            )


def _per_token(values: torch.Tensor, indices: torch.Tensor, d_sae: int) -> Selection:
    """A selection of `indices.shape[1]` latents for every token, from topk's output."""
    batch, k = indices.shape
    indices, order = indices.sort(dim=-1)
    rows = torch.arange(batch, device=indices.device)
    values = values.gather(1, order)
    return Selection(
        rows.repeat_interleave(k), indices.flatten(), rows * k, values.flatten(), d_sae
    )


def topk_selection(scores: torch.Tensor, k: int) -> Selection:
    """TopK: each token's k highest scores (SAELens's TopK, before its ReLU)."""
    values, indices = torch.topk(scores, k, dim=-1, sorted=False)
    return _per_token(values, indices, scores.shape[1])


def batchtopk_selection(scores: torch.Tensor, k: int) -> Selection:
    """BatchTopK: the batch's k * batch highest ReLU'd scores, however they fall on tokens.

    Entries whose ReLU'd score is 0 are left out: they add nothing to the output or gradients
    (SAELens keeps them only when fewer than k * batch scores are positive). The entries are
    found as the scores at or above the (k * batch)-th largest (exact but for ties there, which
    floats make vanishingly rare): nonzero() lists them by token, where sorting topk's indices
    would cost more.
    """
    batch, d_sae = scores.shape
    flat = scores.relu().flatten()
    threshold = torch.topk(flat, k * batch, sorted=False).values.min()
    top = ((flat >= threshold) & (flat > 0)).nonzero().squeeze(1)
    bags = top // d_sae
    counts = torch.bincount(bags, minlength=batch)
    return Selection(bags, top % d_sae, torch.cumsum(counts, 0) - counts, flat[top], d_sae)


def dead_selection(scores: torch.Tensor, dead: torch.Tensor, k_aux: int) -> Selection:
    """AuxK: each token's k_aux highest scores among the dead latents."""
    dead_latents = dead.nonzero().squeeze(1)
    values, local = torch.topk(scores.index_select(1, dead_latents), k_aux, dim=-1, sorted=False)
    return _per_token(values, dead_latents[local], scores.shape[1])


# --- sparse products ------------------------------------------------------------------------------
# With A the selection's sparse [bags, d_sae] matrix (weights at its entries) and T a dense
# [d_sae, d] table: the decoder is A @ W_dec, and autograd's backward of the encoder's A-shaped
# output is A @ W_enc.T and X.T @ A. Three sparse products cover both:


def gather_sum(sel: Selection, weights: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """A @ table, [bags, d]: each bag's weighted sum of its latents' rows."""
    return F.embedding_bag(sel.latents, table, sel.offsets, mode="sum", per_sample_weights=weights)


def scatter_outer(
    sel: Selection, rows: torch.Tensor, weights: torch.Tensor, dense: torch.Tensor
) -> torch.Tensor:
    """A.T @ dense, [d_sae, d]: latent i's row sums weight * dense[row] over i's entries.

    The gather-sum of the transposed selection: one pass that writes each row once, where
    autograd's embedding_bag backward and torch.sparse.mm zero-fill the [d_sae, d] result first
    (measured ~4x slower at GPT-2-small size)."""
    order, offsets = sel.by_latent
    return F.embedding_bag(
        rows[order], dense, offsets, mode="sum", per_sample_weights=weights[order]
    )


def sampled_dot(sel: Selection, dense: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """(dense @ table.T) at the selection's entries, [n]: per entry, its bag's row of `dense`
    dotted with its latent's row of `table` (the gradient of A's weights in A @ table)."""
    out = torch.sparse.sampled_addmm(sel.pattern(), dense, table.t(), beta=0.0)
    return out.values()


class SelectedPreacts(torch.autograd.Function):
    """The encoder's pre-activations at the selected entries, x[t] . W_enc[:, i] + b_enc[i].

    The forward reads them off `preacts` (x @ W_enc, the dense product that selected them); the
    backward is sparse, where autograd through that product would be two more dense ones.
    """

    @staticmethod
    def forward(ctx, x, W_enc, b_enc, preacts, sel: Selection):
        tokens = sel.bags % len(x)
        ctx.save_for_backward(x, W_enc, tokens)
        ctx.sel = sel
        return preacts[tokens, sel.latents] + b_enc[sel.latents]

    @staticmethod
    def backward(ctx, grad):
        x, W_enc, tokens = ctx.saved_tensors
        sel: Selection = ctx.sel
        grad = grad.float()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            # Gathering W_enc's strided columns was 6-40x slower than a transposed copy's rows.
            bags = gather_sum(sel, grad, W_enc.t().contiguous())
            grad_x = bags.view(-1, *x.shape).sum(0)  # each token's bags from every part
        if ctx.needs_input_grad[1]:
            grad_w = scatter_outer(sel, tokens, grad, x).t()
        if ctx.needs_input_grad[2]:
            # A.T @ ones; index_add_ would do too, but adds in a varying order on CUDA.
            grad_b = scatter_outer(sel, torch.zeros_like(tokens), grad, grad.new_ones(1, 1))
            grad_b = grad_b.squeeze(1)
        return grad_x, grad_w, grad_b, None, None


class SparseDecoder(torch.autograd.Function):
    """The decoder without b_dec, A @ W_dec: each bag's weighted sum of its latents' W_dec rows."""

    @staticmethod
    def forward(ctx, weights, W_dec, sel: Selection):
        ctx.save_for_backward(weights, W_dec)
        ctx.sel = sel
        return gather_sum(sel, weights, W_dec)

    @staticmethod
    def backward(ctx, grad):
        weights, W_dec = ctx.saved_tensors
        sel: Selection = ctx.sel
        grad_weights = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_weights = sampled_dot(sel, grad, W_dec)
        if ctx.needs_input_grad[1]:
            grad_w = scatter_outer(sel, sel.bags, weights, grad)
        return grad_weights, grad_w, None


# --- the training forward pass --------------------------------------------------------------------
@dataclass
class SparseStep:
    loss: torch.Tensor
    losses: dict[str, torch.Tensor]
    sae_out: torch.Tensor
    main: Selection  # the TopK / BatchTopK latents (the SAE's activations)


def sparse_forward(
    sae: Any,
    sae_in: torch.Tensor,
    dead: torch.Tensor | None,
    autocast: bool = False,
) -> SparseStep:
    """SAELens's TopK / BatchTopK training loss (MSE + AuxK) with sparse gradients.

    `sae` is SAELens's TopKTrainingSAE or BatchTopKTrainingSAE; `dead` the trainer's dead-latent
    mask. The losses equal SAELens's `training_forward_pass` on the same weights and batch. A
    transcoder's batch is [input | target] (sae.transcoder.split): the losses compare with the
    target.
    """
    cfg = sae.cfg
    sae_in, target = split(sae, sae_in)
    batch = sae_in.shape[0]
    x = sae.process_sae_in(sae_in)  # SAELens's: minus b_dec (with its gradient), not a transcoder
    with torch.no_grad():
        with torch.autocast(sae_in.device.type, dtype=torch.bfloat16, enabled=autocast):
            preacts = x @ sae.W_enc  # b_enc is added below, in the same pass as the norms
        norms = sae.W_dec.norm(dim=-1) if cfg.rescale_acts_by_decoder_norm else x.new_ones(())
        scores = torch.addcmul(sae.b_enc * norms, preacts, norms)  # (x W_enc + b_enc) * norms
        if cfg.architecture() == "batchtopk":
            main = batchtopk_selection(scores, int(cfg.k))
        else:
            main = topk_selection(scores, int(cfg.k))
        n_dead = int(dead.sum()) if dead is not None else 0
        sel = main
        if n_dead:
            k_aux, aux_scale = aux_size(cfg.d_in, n_dead)
            sel = main.then(dead_selection(scores, dead, k_aux))
    h = SelectedPreacts.apply(x, sae.W_enc, sae.b_enc, preacts, sel)
    # TopK activations are ReLU'd; AuxK's are not (SAELens's calculate_topk_aux_acts).
    weights = torch.cat([h[: len(main)].relu(), h[len(main) :]])
    decoded = SparseDecoder.apply(weights, sae.W_dec, sel)
    sae_out = decoded[:batch] + sae.b_dec
    mse = (sae_out - target).pow(2).sum(-1).mean()
    aux = sae_out.new_zeros(())
    if n_dead:
        # Dead latents predict what the live ones missed; no b_dec, it is in the residual.
        residual = (target - sae_out).detach()
        aux = (decoded[batch:] - residual).pow(2).sum(-1).mean()
        aux = cfg.aux_loss_coefficient * aux_scale * aux
    return SparseStep(
        loss=mse + aux,
        losses={"mse_loss": mse, "auxiliary_reconstruction_loss": aux},
        sae_out=sae_out,
        main=main,
    )


# --- the trainer ----------------------------------------------------------------------------------
class SparseTopKTrainer(ControlledSAETrainer):
    """SAELens's trainer (as ControlledSAETrainer: control hook, checkpoints) with the step of
    `sparse_forward`. Everything else (fit, scaling, schedules, state) is SAELens's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        if self.sae.cfg.normalize_activations not in ("none", "expected_average_only_in"):
            raise ValueError("the fast trainer needs inputs scaled outside the SAE")
        # SAETrainer's Adam, fused (SAELens runs the per-tensor loop on CPU: 5x slower at
        # GPT-2-small size). The scheduler is rebuilt because it holds the optimiser.
        self.optimizer = torch.optim.Adam(
            self.sae.parameters(), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), fused=True
        )
        self.lr_scheduler = get_lr_scheduler(
            cfg.lr_scheduler_name,
            lr=cfg.lr,
            optimizer=self.optimizer,
            warm_up_steps=cfg.lr_warm_up_steps,
            decay_steps=cfg.lr_decay_steps,
            training_steps=cfg.total_training_steps,
            lr_end=cfg.lr_end,
            num_cycles=cfg.n_restart_cycles,
        )

    def _train_step(self, sae: Any, sae_in: torch.Tensor) -> TrainStepOutput:
        """SAETrainer._train_step with `sparse_forward` for the SAE's training_forward_pass.
        After an out-of-memory error the step is redone over micro-batches of the halved size
        (memory.OOMBackoff, as ControlledSAETrainer does), each loss weighted by its share of the
        rows: the same step, learning rate and data up to float rounding."""
        sae.train()

        def attempt(size: int) -> list[tuple[int, Any]]:
            self.optimizer.zero_grad()  # whatever a failed try left
            parts = []
            for start in range(0, len(sae_in), size):
                part = sae_in[start : start + size]
                step = sparse_forward(sae, part, self.dead_neurons, self.cfg.autocast)
                (step.loss * (len(part) / len(sae_in))).backward()
                parts.append((start, step))
            return parts

        parts = self.backoff.run(attempt)
        with torch.no_grad():
            activations = torch.cat([step.main.scores.relu() for _, step in parts])
            latents = torch.cat([step.main.latents for _, step in parts])
            bags = torch.cat([step.main.bags + start for start, step in parts])
            self._record_firing(latents[activations > 0])
            if sae.cfg.architecture() == "batchtopk":
                for _, step in parts:
                    sae.update_topk_threshold(step.main.scores.relu())
        self._optimiser_step(sae)
        share = [len(step.sae_out) / len(sae_in) for _, step in parts]
        loss = sum(w * step.loss.detach() for w, (_, step) in zip(share, parts, strict=True))
        losses = {
            k: sum(w * step.losses[k] for w, (_, step) in zip(share, parts, strict=True))
            for k in parts[0][1].losses
        }
        # SAELens's dense [batch, d_sae] outputs, as sparse tensors (fit() reads only losses).
        entries = torch.stack([bags, latents])
        shape = (len(sae_in), sae.cfg.d_sae)
        scores = torch.cat([step.main.scores for _, step in parts])
        return TrainStepOutput(
            sae_in=sae_in,
            sae_out=torch.cat([step.sae_out for _, step in parts]),
            feature_acts=torch.sparse_coo_tensor(
                entries, activations, shape, check_invariants=False
            ),
            hidden_pre=torch.sparse_coo_tensor(entries, scores, shape, check_invariants=False),
            loss=loss,
            losses=losses,
        )

    @torch.no_grad()
    def _record_firing(self, fired: torch.Tensor) -> None:
        """SAETrainer's firing statistics, from the latents that fired (with repeats)."""
        counts = torch.bincount(fired, minlength=self.sae.cfg.d_sae).float()
        self.n_forward_passes_since_fired += 1
        self.n_forward_passes_since_fired[counts > 0] = 0
        self.act_freq_scores += counts
        self.n_frac_active_samples += self.cfg.train_batch_size_samples
