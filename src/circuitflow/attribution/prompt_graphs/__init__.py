"""Per-prompt attribution graphs on transcoders (circuit-tracer's replacement graphs):
`replacement` builds a prompt's exact linear graph, `prune` its influence, pruning and scores,
`files` the graph files, `stage` the rule's job."""
