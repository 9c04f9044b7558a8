#!/usr/bin/env python
"""Activation capture. `tokens` builds the capture token set (packed contexts, hashed); `run`
captures every configured site and layer in one forward pass per batch into HDF5 files (resuming
a killed run from its .partial files; exit 75 after a SIGTERM checkpoint); `merge` joins shard
files into one."""

from circuitflow import cli
from circuitflow.capture import tokens


def run() -> None:
    parser = cli.parser(__doc__)
    sub = cli.subcommands(parser)
    p = sub.add_parser("tokens", help="build the capture token set")
    cli.add_inputs(p, "config", "model-json")
    cli.add_outputs(p, "npy", "json", npy="tokens.npy to write", json="tokens.json to write")
    p = sub.add_parser("run", help="capture activations")
    cli.add_inputs(p, "config", "model-json")
    p.add_argument("--tokens-npy", required=True)
    p.add_argument("--tokens-json", required=True)
    cli.add_outputs(p, "dir", dir="files go to OUT_DIR/{site}/layer_{layer}.h5")
    p.add_argument("--shard", type=int, default=0, help="this job's shard index")
    p.add_argument("--n-shards", type=int, default=1, help="shards the token set is split into")
    p = sub.add_parser("merge", help="join shard files, in order, into one file")
    p.add_argument("--out", required=True)
    p.add_argument("shards", nargs="+")
    args, config = cli.parse(parser)
    if args.command == "tokens":
        meta = tokens.run(config, args.model_json, args.out_npy, args.out_json)
        print(
            f"token set: {meta['n_contexts']} contexts x {meta['context_length']} tokens from "
            f"{meta['source']}, sha256 {meta['token_set_hash'][:12]}"
        )
    elif args.command == "run":
        from circuitflow.capture import stage  # the model's libraries: not for the token set

        result = stage.run(
            config,
            args.model_json,
            args.tokens_npy,
            args.tokens_json,
            args.out_dir,
            args.shard,
            args.n_shards,
        )
        print(
            f"captured {result.n_tokens} tokens: {result.tokens_per_s:.0f} tokens/s, "
            f"peak memory {result.peak_memory_mb:.0f} MiB"
        )
    else:
        from circuitflow.capture import files  # h5py: the merge alone

        files.merge_shards(args.shards, args.out)
        print(f"merged {len(args.shards)} shards -> {args.out}")


if __name__ == "__main__":
    cli.main(run)
