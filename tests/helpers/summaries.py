"""Headline numbers of interventions summaries that tests build pages and flags from."""

# The embedded default's induction summary (one training): random circuits reach the
# circuit's completeness, the held-out faithfulness falls under the threshold, and the
# attribution graph's nodes keep almost nothing of the behaviour as a circuit.
INDUCTION_SUMMARY = {
    "faithfulness_threshold": 0.8, "circuit_size": 370, "smallest_faithful_size": 370,
    "faithfulness": 0.825, "random_faithfulness": 0.0133,
    "completeness": 0.994, "random_completeness": 1.0067,
    "faithfulness_heldout": 0.751, "random_faithfulness_heldout": 0.0041,
    "completeness_heldout": 0.998, "random_completeness_heldout": 1.0013,
    "random_faithfulness_at_smallest": 0.0133, "faithfulness_curve": {369: 0.79, 370: 0.825},
    "graph_circuit": {"n": 15, "faithfulness": -0.008, "completeness": 0.998,
                      "faithfulness_heldout": 0.00106, "completeness_heldout": 0.997},
}  # fmt: skip
