"""Feature interpretation: per-feature statistics of a dictionary over a stream of tokens, and
labels scored on tokens held out from every dictionary and label.

- `collect`: the streaming accumulator (density, activation histogram, maximum, top-k and
  quantile-sampled contexts; across features the log-density histogram, dead and dense lists);
- `windows`: the token windows (with per-token activations) of the contexts kept;
- `logits`: promoted and suppressed output tokens (decoder through the unembedding);
- `held_out`: the held-out contexts (rule held_out_tokens) and the examples drawn from them;
- `rules`: the rules a label states (token, neighbour, repetition, position), as predicates;
- `scores`: counting rules over positions, choosing the best one, scoring, the control;
- `labels`: the labellers (`tokens`, `rules`), their scores' columns and the text shown;
- `explainer`: a language model's descriptions, scored by detection (rules explain_features_*);
- `write`: the folder `features/{site}/layer_{layer}/` (Parquet and JSON);
- `neuronpedia`: the feature batches SAEDashboard's Neuronpedia runner writes.
"""
