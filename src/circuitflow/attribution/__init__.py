"""Attribution (rule attribution): which nodes drive a behaviour's metric.

`stage` writes the stage's files; `splice` is the patchable forward pass with SAEs spliced in,
`scores` the fast methods (AtP, IG) and the exact reference, `graph` the pruned graph and its
edges, `page` graph.html, `contexts` features' top activating contexts, `plots` the figures.
"""
