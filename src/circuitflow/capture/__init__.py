"""Activation capture (rules capture_tokens, capture, capture_shard, merge_capture).

`tokens` builds the token set, `stage` runs the model and writes, `files` is the HDF5 format
and its one reader (`open_activations`), which every later stage uses.
"""
