"""Site mlp_in's hook on a model as it is loaded (circuitflow.nodes.mlp_input): the one place
that decides it, which every hook name of the site goes through."""

from __future__ import annotations

import pytest

from circuitflow.nodes import hook_name, mlp_input, site_layer


@pytest.mark.parametrize(
    ("normalization", "norm_after"),
    [("LN", True), ("RMS", True), ("LNPre", False), ("RMSPre", False)],
)
def test_mlp_in_is_the_normalised_residual_and_says_whether_the_weight_follows(
    normalization, norm_after
):
    """Unfolded norms apply their weight after ln2.hook_normalized, on the way to the MLP;
    folded ones (TransformerLens's fold_ln) leave the hook exactly what the MLP receives."""
    got = mlp_input(normalization)
    assert (got.hook, got.norm_after) == ("ln2.hook_normalized", norm_after)
    hook = hook_name("mlp_in", 3, normalization)
    assert hook == "blocks.3.ln2.hook_normalized" and site_layer(hook) == ("mlp_in", 3)


def test_a_model_without_a_norm_before_its_mlps_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^normalization_type None: site mlp_in reads") as err:
        mlp_input(None)
    assert "\n" not in str(err.value)
