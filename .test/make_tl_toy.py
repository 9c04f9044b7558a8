#!/usr/bin/env python
"""Make .test/tl-toy/ (a TransformerLens checkpoint directory: one layer, no LayerNorm, a
previous-token head planted by hand; tests/helpers/tl_checkpoints.py says how), its prompts
.test/tl-toy-previous.csv ("which word came before the last one?") and its corpus
.test/tl-toy-corpus.txt: what config/your-own-model.yaml runs. No download.

    python .test/make_tl_toy.py        # rewrites them (they are committed)
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))


def main() -> None:
    from helpers import tl_checkpoints

    tl_checkpoints.write_example(HERE)


if __name__ == "__main__":
    main()
