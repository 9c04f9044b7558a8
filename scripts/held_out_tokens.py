#!/usr/bin/env python
"""The held-out contexts the features' labels are scored on (rule held_out_tokens):
features.held_out_tokens tokens no dictionary was trained or evaluated on, after the run's
token set (the embedded language: a random stream of their own; a corpus: the contexts packed
after the token set's), written as activations/held_out_tokens.npy and .json.

Exit status: 0 done; 2 bad config or unusable input (a corpus too short names the key)."""

from circuitflow import cli


def run() -> None:
    parser = cli.parser(__doc__)
    cli.add_inputs(parser, "config", "model-json")
    parser.add_argument("--tokens-json", required=True, help="the token set's tokens.json")
    cli.add_outputs(parser, "npy", "json", npy="held_out_tokens.npy to write",
                    json="held_out_tokens.json to write")  # fmt: skip
    args, config = cli.parse(parser)
    from circuitflow.features import held_out

    meta = held_out.run(config, args.model_json, args.tokens_json, args.out_npy, args.out_json)
    print(
        f"held-out contexts: {meta['n_contexts']} x {meta['context_length']} tokens, "
        f"{meta['how']}, sha256 {meta['token_set_hash'][:12]}"
    )


if __name__ == "__main__":
    cli.main(run)
