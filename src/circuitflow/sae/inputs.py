"""What train_sae trains on, checked before the stage imports SAELens or loads the model: one
activation file (an SAE), or the MLP's input and output files at one layer (a transcoder).
scripts/train_sae.py refuses an unusable set with this same check (in about 0.4 s of CPU, where
the stage's imports alone take 5)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from circuitflow.capture.files import ActivationFileInfo, check_pair, read_activation_info
from circuitflow.errors import ConfigError
from circuitflow.sae.config import HOOKS_READ, SAETrainConfig

if TYPE_CHECKING:
    from circuitflow.sae.data import ActivationStreamConfig


@dataclass
class Inputs:
    """The activation files a dictionary trains on: its site's (an SAE), or the MLP's input and
    output at one layer (a transcoder, `target` the output's)."""

    info: ActivationFileInfo
    target: ActivationFileInfo | None = None

    @classmethod
    def read(cls, cfg: SAETrainConfig, activations) -> Inputs:
        paths = [activations] if isinstance(activations, str | Path) else list(activations)
        want = HOOKS_READ[cfg.kind]
        if len(paths) != want:
            what = "the MLP's input and output files" if want == 2 else "one activation file"
            raise ConfigError(f"--activations: sae.kind {cfg.kind} trains on {what}, got {paths}")
        infos = [read_activation_info(p) for p in paths]
        if want == 2:
            check_pair(*infos)
        return cls(*infos)

    def stream(self, cfg: ActivationStreamConfig, position: int):
        """The training batches, from batch `position`."""
        # The readers need torch: imported by training, not by the check above.
        from circuitflow.sae.data import ActivationStream, PairedActivationStream

        if self.target is None:
            return ActivationStream(self.info, cfg, position)
        return PairedActivationStream(self.info, self.target, cfg, position)

    @property
    def site(self) -> str:
        """Where the dictionary is spliced: the site it reconstructs or predicts."""
        return (self.target or self.info).site
