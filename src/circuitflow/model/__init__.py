"""The model under study (rules train_model, prefetch_model).

`load` loads any model kind as a HookedTransformer, `embedded` trains the embedded default on
the synthetic `language`, `architectures` knows model shapes without loading weights.
"""
