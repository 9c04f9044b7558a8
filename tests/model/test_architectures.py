"""The real architectures' planning shapes (architectures.shape, read without TransformerLens)
against the TransformerLens configs the benchmarks and the loaded models use."""

from __future__ import annotations

import subprocess
import sys

import pytest

from circuitflow.model import architectures


@pytest.mark.parametrize("name", sorted(architectures.ARCHITECTURES))
def test_planning_shape_is_the_transformer_lens_config(name):
    shape, config = architectures.shape(name), architectures.config(name)
    for field in architectures.SHAPE_FIELDS:
        assert getattr(shape, field) == getattr(config, field), field
    assert architectures.n_params(shape) == architectures.n_params(config)
    assert architectures.matmul_params_per_layer(shape) == (
        architectures.matmul_params_per_layer(config)
    )


def test_planning_a_real_model_imports_neither_torch_nor_transformer_lens():
    """The shape a dry run of a real model's config plans with (model_cfg), in a fresh
    interpreter: TransformerLens's import alone is about 5 s of CPU."""
    code = (
        "import sys\n"
        "from circuitflow.model import architectures\n"
        "cfg = architectures.model_cfg({'model': {'name': 'gpt2'}})\n"
        "print(architectures.n_params(cfg), 'transformer_lens' in sys.modules, "
        "'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    n_params, lens, torch = out.stdout.split()
    assert int(n_params) == architectures.n_params(architectures.gpt2_small())
    assert (lens, torch) == ("False", "False")
