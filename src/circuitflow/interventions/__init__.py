"""Interventions (rules interventions, interventions_across): ablations and steering that test
what attribution claims.

`stage` writes the stage's files; `inputs` reads attribution's outputs, `selection` picks the
circuit and the heads to test, `ablation` runs the model with nodes ablated or steered, `stats`
repeats effects over seeds, `circuits`, `heads` and `features` are the three studies, `summary`
writes summary.json and its headline, `flags` the flags on its numbers, `plots` the figures;
`across` joins the behaviours' single-head tables.
"""
