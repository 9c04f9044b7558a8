"""features.png: each panel's features named by their feature-browser anchor and label."""

from __future__ import annotations

import pandas as pd

from circuitflow.attribution.plots import LABEL_CHARS, top_features


def test_top_features_name_each_feature_by_anchor_and_label():
    features = pd.DataFrame(
        {
            "site": ["resid_post"] * 4 + ["resid_post"],
            "layer": [1, 1, 1, 1, 0],
            "feature": [355, -1, 7, 12, 3],
            "score": [0.9, -0.5, 0.3, -0.1, 0.2],
        }
    )
    long = "fires on " + " / ".join(f'"w{k}"' for k in range(20))
    labels = {("resid_post", 1): {355: 'fires on "s3"; promotes "f3"', 7: long}}
    fig = top_features(features, top=3, title="t", labels=labels)
    ticks = {ax.get_title(): [t.get_text() for t in ax.get_yticklabels()] for ax in fig.axes}
    # Barh draws bottom-up: the largest |score| is the last tick.
    assert ticks["resid_post layer 1"] == [
        "resid_post.1.f7 — " + long[: LABEL_CHARS - 1] + "…",
        "error",
        'resid_post.1.f355 — fires on "s3"; promotes "f3"',
    ]
    assert ticks["resid_post layer 0"] == ["resid_post.0.f3"]  # no label: the name alone
