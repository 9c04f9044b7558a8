"""Feature interpretation: per-feature statistics of a dictionary over a stream of tokens.

- `collect`: the streaming accumulator (density, activation histogram, maximum, top-k and
  quantile-sampled contexts; across features the log-density histogram, dead and dense lists);
- `windows`: the token windows (with per-token activations) of the contexts kept;
- `logits`: promoted and suppressed output tokens (decoder through the unembedding);
- `labels`: short deterministic labels, a registry of labellers;
- `write`: the folder `features/{site}/layer_{layer}/` (Parquet and JSON);
- `neuronpedia`: the feature batches SAEDashboard's Neuronpedia runner writes.
"""
