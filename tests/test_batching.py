"""circuitflow.batching: how every stage after `prompts` batches and splits a prompt set."""

from __future__ import annotations

import numpy as np
import pandas as pd

from circuitflow.batching import by_length, selection_half


def test_by_length_groups_rows_of_one_length_in_first_seen_order():
    token_lists = [[1, 2, 3], [4], [5, 6, 7], [8, 9], [10]]
    groups = by_length(token_lists)
    assert [g.tolist() for g in groups] == [[0, 2], [1, 4], [3]]
    for rows in groups:  # one length per batch: no padding
        assert len({len(token_lists[i]) for i in rows}) == 1


def test_selection_half_chooses_on_even_ids_and_holds_out_odd_ones():
    prompts = pd.DataFrame({"prompt_id": [4, 7, 0, 3, 10]})
    assert selection_half(prompts).tolist() == [True, False, True, False, True]
    assert selection_half(prompts).dtype == np.bool_
