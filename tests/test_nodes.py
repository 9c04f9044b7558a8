"""Site mlp_in's hook on a model as it is loaded (circuitflow.nodes.mlp_input): the one place
that decides it, which every hook name of the site goes through."""

from __future__ import annotations

import pytest

from circuitflow.nodes import hook_name, hook_names, mlp_input, site_layer


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


def test_without_norms_mlp_in_is_the_residual_stream_the_mlp_reads():
    """A model without norms (a TransformerLens checkpoint's normalization_type None) feeds
    its MLP resid_mid as it is: the same tensor, so a file of either site names that hook."""
    got = mlp_input(None)
    assert (got.hook, got.norm_after) == ("hook_resid_mid", False)
    assert hook_name("mlp_in", 3, None) == "blocks.3.hook_resid_mid"
    assert site_layer("blocks.3.hook_resid_mid") == ("resid_mid", 3)
    assert hook_names("mlp_in", 3) == ("blocks.3.ln2.hook_normalized", "blocks.3.hook_resid_mid")
    assert hook_names("resid_post", 3) == ("blocks.3.hook_resid_post",)


def test_an_unknown_normalization_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^normalization_type 'XX': site mlp_in reads") as err:
        mlp_input("XX")
    assert "\n" not in str(err.value)
