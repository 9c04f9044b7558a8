"""PI control of an SAE's sparsity coefficient towards a target L0.

The controller acts in log space on both sides: the error is log(L0_ema / target) and the
coefficient is ``coef0 * exp(u)``. L0 responds roughly multiplicatively to the coefficient over
orders of magnitude, so log space gives one set of gains that works from L0 = 4 to L0 = 400.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from circuitflow.schema import schema_defaults

_D = schema_defaults("sae.controller")


@dataclass
class SparsityControllerConfig:
    """Gains and limits of the PI controller (``sae.controller``; defaults: the schema's)."""

    kp: float = _D["kp"]
    ki: float = _D["ki"]
    # Steps between coefficient updates; L0 is smoothed every step regardless.
    update_every: int = _D["update_every"]
    # EMA weight of the newest L0 observation.
    ema: float = _D["ema"]
    coef_min: float = _D["coef_min"]
    coef_max: float = _D["coef_max"]
    # Clip on |log error|: the first L0 (all latents half on) is far off, and integrating that
    # drives the coefficient past equilibrium before the slow L0 response catches up.
    max_error: float = _D["max_error"]


@dataclass
class ControllerState:
    ema_l0: float | None = None
    integral: float = 0.0
    coefficient: float = 0.0
    history: list[list[float]] = field(default_factory=list)


class SparsityController:
    """Drives a sparsity coefficient so that the EMA-smoothed L0 settles at ``target_l0``."""

    def __init__(
        self, target_l0: float, initial_coefficient: float, cfg: SparsityControllerConfig
    ) -> None:
        if target_l0 <= 0:
            raise ValueError("target_l0 must be positive")
        if not cfg.coef_min <= initial_coefficient <= cfg.coef_max:
            raise ValueError(
                f"initial coefficient {initial_coefficient} outside "
                f"[coef_min, coef_max] = [{cfg.coef_min}, {cfg.coef_max}]"
            )
        self.target_l0 = target_l0
        self.initial_coefficient = initial_coefficient
        self.cfg = cfg
        self.state = ControllerState(coefficient=initial_coefficient)

    @property
    def coefficient(self) -> float:
        return self.state.coefficient

    def observe(self, step: int, l0: float) -> float:
        """Record the L0 of training step ``step``; return the coefficient for the next step."""
        s, c = self.state, self.cfg
        s.ema_l0 = l0 if s.ema_l0 is None else (1 - c.ema) * s.ema_l0 + c.ema * l0
        if (step + 1) % c.update_every != 0:
            return s.coefficient
        # +1 keeps the log finite when every latent is switched off.
        error = math.log((s.ema_l0 + 1.0) / (self.target_l0 + 1.0))
        error = min(max(error, -c.max_error), c.max_error)
        lo = math.log(c.coef_min / self.initial_coefficient)
        hi = math.log(c.coef_max / self.initial_coefficient)
        u = c.kp * error + c.ki * (s.integral + error)
        # Anti-windup (conditional integration): stop integrating while the output is pinned at
        # a bound and the error would push it further past that bound.
        saturated = (u >= hi and error > 0) or (u <= lo and error < 0)
        if not saturated:
            s.integral += error
        u = min(max(c.kp * error + c.ki * s.integral, lo), hi)
        s.coefficient = self.initial_coefficient * math.exp(u)
        s.history.append([step + 1, s.ema_l0, s.coefficient])
        return s.coefficient

    def state_dict(self) -> dict[str, Any]:
        s = self.state
        return {
            "ema_l0": s.ema_l0,
            "integral": s.integral,
            "coefficient": s.coefficient,
            "history": s.history,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.state = ControllerState(
            ema_l0=d["ema_l0"],
            integral=float(d["integral"]),
            coefficient=float(d["coefficient"]),
            history=[list(h) for h in d["history"]],
        )


def plot_history(
    history: list[list[float]], target_l0: float, coefficient_name: str, path: Path
) -> None:
    """Write a PNG of L0 (with the target) and the coefficient against training step."""
    from circuitflow.io import save_figure
    from circuitflow.plots import pyplot

    plt = pyplot()
    steps = [h[0] for h in history]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(6, 5), sharex=True)
    ax1.plot(steps, [h[1] for h in history], label="L0 (EMA)")
    ax1.axhline(target_l0, color="k", linestyle="--", label="target")
    ax1.set_ylabel("L0")
    ax1.legend()
    ax2.plot(steps, [h[2] for h in history], color="tab:red")
    ax2.set_yscale("log")
    ax2.set_ylabel(f"{coefficient_name} coefficient")
    ax2.set_xlabel("training step")
    fig.tight_layout()
    save_figure(path, fig, dpi=100)
