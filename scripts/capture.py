#!/usr/bin/env python
"""Activation capture. `tokens` builds the capture token set (packed contexts, hashed); `run`
captures every configured site and layer in one forward pass per batch into HDF5 files (resuming
a killed run from its .partial files; exit 75 after a SIGTERM checkpoint); `merge` joins shard
files into one."""

import argparse
import os
import sys
from pathlib import Path

from circuitflow import capture, corpus
from circuitflow import config as cf_config
from circuitflow.cli import main


def tokens(args) -> None:
    config = cf_config.load(args.config)
    if config["model"].get("hf_cache"):
        os.environ["HF_HOME"] = str(Path(config["model"]["hf_cache"]).expanduser())
    toks, meta = corpus.build_token_set(
        config["capture"], config["seed"], Path(args.model_json).parent
    )
    corpus.write_token_set(toks, meta, args.out_npy, args.out_json)
    print(
        f"token set: {meta['n_contexts']} contexts x {meta['context_length']} tokens from "
        f"{meta['source']}, sha256 {meta['token_set_hash'][:12]}"
    )


def run_capture(args) -> None:
    from circuitflow.models import load_model

    config = cf_config.load(args.config)
    toks, meta = corpus.read_token_set(args.tokens_npy, args.tokens_json)
    opts = capture.CaptureOptions.from_config(config["capture"])
    unit = capture.unit_contexts(opts, meta["context_length"])
    span = capture.shard_range(len(toks), unit, args.shard, args.n_shards)
    targets = {
        (site, layer): Path(args.out_dir) / site / f"layer_{layer}.h5"
        for site in config["sites"]
        for layer in config["layers"]
    }
    model = load_model(Path(args.model_json).parent, config["device"], config["model"]["dtype"])
    try:
        result = capture.capture(
            model, toks, meta, targets, opts, span, shard=(args.shard, args.n_shards)
        )
    except capture.Interrupted as err:
        print(str(err), file=sys.stderr)
        sys.exit(capture.EXIT_CHECKPOINTED)
    except MemoryError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(3)
    print(
        f"captured {result.n_tokens} tokens x {len(targets)} hooks: "
        f"{result.tokens_per_s:.0f} tokens/s, peak memory {result.peak_memory_mb:.0f} MiB"
    )


def merge(args) -> None:
    capture.merge_shards(args.shards, args.out)
    print(f"merged {len(args.shards)} shards -> {args.out}")


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tokens", help="build the capture token set")
    p.add_argument("--config", required=True, help="resolved config JSON or a config YAML file")
    p.add_argument("--model-json", required=True, help="the model stage's model.json")
    p.add_argument("--out-npy", required=True, help="tokens.npy to write")
    p.add_argument("--out-json", required=True, help="tokens.json to write")
    p.set_defaults(fn=tokens)
    p = sub.add_parser("run", help="capture activations")
    p.add_argument("--config", required=True, help="resolved config JSON or a config YAML file")
    p.add_argument("--model-json", required=True, help="the model stage's model.json")
    p.add_argument("--tokens-npy", required=True)
    p.add_argument("--tokens-json", required=True)
    p.add_argument("--out-dir", required=True, help="files go to OUT_DIR/{site}/layer_{layer}.h5")
    p.add_argument("--shard", type=int, default=0, help="this job's shard index")
    p.add_argument("--n-shards", type=int, default=1, help="shards the token set is split into")
    p.set_defaults(fn=run_capture)
    p = sub.add_parser("merge", help="join shard files, in order, into one file")
    p.add_argument("--out", required=True)
    p.add_argument("shards", nargs="+")
    p.set_defaults(fn=merge)
    args = parser.parse_args()
    args.fn(args)


if __name__ == "__main__":
    main(run)
