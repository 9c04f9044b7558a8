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


def test_official_names_are_transformer_lens_own_without_importing_it():
    """architectures.official_name reads TransformerLens's alias table without importing the
    package: the same answer as get_official_model_name for every official name and alias
    (any case), None where that raises, and in a fresh interpreter no transformer_lens."""
    from transformer_lens.loading_from_pretrained import get_official_model_name
    from transformer_lens.supported_models import MODEL_ALIASES, OFFICIAL_MODEL_NAMES

    names = [*OFFICIAL_MODEL_NAMES, *(a for aliases in MODEL_ALIASES.values() for a in aliases)]
    names += [n.upper() for n in names[::7]] + ["not-a-model", "Qwen/Qwen3-0.6B-fine-tune"]
    for name in names:
        try:
            want = get_official_model_name(name)
        except ValueError:
            want = None
        assert architectures.official_name(name) == want, name
    assert architectures.official_name("qwen3-0.6b") == "Qwen/Qwen3-0.6B"
    code = (
        "import sys\n"
        "from circuitflow.model import architectures\n"
        "print(architectures.official_name('gpt2-small'), 'transformer_lens' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["gpt2", "False"], done.stdout + done.stderr[-2000:]
