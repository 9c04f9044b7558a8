"""Interventions (rules interventions, interventions_across): ablations and steering that test
what attribution claims.

`stage` writes the stage's files; `ablation` runs the model with nodes ablated or steered,
`stats` repeats effects over seeds, `circuits`, `heads` and `features` are the three studies,
`plots` the figures.
"""
