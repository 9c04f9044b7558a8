"""Per-layer SAE training (rule train_sae).

`stage` trains, measures and writes one SAE; `config` is the `sae:` section, `architectures`
the registry of what can be trained, `trainer` SAELens's trainer with control and checkpoints,
`data` streams shuffled batches from an activation file, `checkpoint` and `sparsity` the
checkpoint files and the L0 controller, `metrics` the quality measured on the model.
`cross_layer` holds cross-layer transcoders, `cross_layer_train` trains them (a library core,
features sharded over torch.distributed ranks; no rule yet).
"""
