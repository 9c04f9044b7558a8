"""Attribution (rule attribution): which nodes drive a behaviour's metric.

`stage` writes the stage's files; `splice` is the patchable forward pass with SAEs spliced in,
`methods` the registry of fast methods (AtP, IG), `scores` every node's score by the configured
method and the exact reference, `graph` the pruned graph and its edges, `page` graph.html,
`contexts` features' top activating contexts, `plots` the figures.
"""
