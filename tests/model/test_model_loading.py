"""The real-model path on a tiny GPT-2-architecture Hugging Face directory made by the tests."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.dag import read_json

from circuitflow import config as cf
from circuitflow.devices import resolve_dtype
from circuitflow.io import write_json
from circuitflow.model.load import load_model, load_tokenizer, prefetch
from circuitflow.prompts import Encoder, factual_recall_prompts, file_prompts, ioi_prompts


def test_layer_count_is_read_from_the_directory(tiny_hf_model_dir):
    resolved = cf.resolve(
        {
            "model": {"name": str(tiny_hf_model_dir)},
            "layers": "0-1",
            "behaviours": {"ioi": {"source": "ioi"}},
            "capture": {"corpus": "corpus.txt"},
        },
        ".",
    )
    assert resolved["layers"] == [0, 1]
    with pytest.raises(cf.ConfigError, match="capture.corpus: a real model needs a corpus"):
        cf.resolve(
            {"model": {"name": str(tiny_hf_model_dir)}, "behaviours": {"ioi": {"source": "ioi"}}}
        )
    with pytest.raises(cf.ConfigError, match="layers: layer 2 is outside the model"):
        cf.resolve(
            {
                "model": {"name": str(tiny_hf_model_dir)},
                "layers": [2],
                "behaviours": {"ioi": {"source": "ioi"}},
                "capture": {"corpus": "corpus.txt"},
            },
            ".",
        )


def test_local_directory_loads_with_the_hugging_face_models_logits(tiny_hf_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    write_json(tmp_path / "model.json", prefetch(str(tiny_hf_model_dir)))
    info = read_json(tmp_path / "model.json")
    assert info["kind"] == "local_hf" and info["architecture"]["n_layers"] == 2
    model = load_model(tmp_path, device="cpu", dtype="auto")
    assert next(model.parameters()).dtype == torch.float32  # auto on CPU
    hf = AutoModelForCausalLM.from_pretrained(tiny_hf_model_dir).eval()
    tokens = torch.tensor([[0, 5, 17, 42, 7, 99]])
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert load_tokenizer(tmp_path).decode([0]) == "<|endoftext|>"


def test_dtype_auto_is_fp32_on_cpu_and_explicit_dtypes_pass_through():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16


def test_generators_make_equal_length_pairs_with_single_token_answers(tiny_hf_model_dir):
    from transformers import AutoTokenizer

    encoder = Encoder(AutoTokenizer.from_pretrained(tiny_hf_model_dir))
    rng = np.random.default_rng(0)
    for frame in (ioi_prompts(encoder, rng, 40), factual_recall_prompts(encoder, rng, 40)):
        assert len(frame) > 10
        assert all(
            len(c) == len(k)
            for c, k in zip(frame.clean_tokens, frame.corrupted_tokens, strict=True)
        )
        assert (frame.answer_id != frame.distractor_id).all()
    ioi = ioi_prompts(encoder, rng, 5)
    row = ioi.iloc[0]
    assert row.clean_text.split()[-1] == "to"  # the answer follows the prompt
    assert (
        row.answer_text.strip() in row.clean_text and row.distractor_text.strip() in row.clean_text
    )


def test_file_prompts_borrow_a_corrupted_twin_or_fail_clearly(tiny_hf_model_dir, tmp_path):
    from transformers import AutoTokenizer

    encoder = Encoder(AutoTokenizer.from_pretrained(tiny_hf_model_dir))
    good = tmp_path / "good.csv"
    # Swapping two single-token names keeps the token count, so each row can borrow the other.
    prompts = [
        "Then, John and Mary went to the store. John gave a ring to",
        "Then, Mary and John went to the store. Mary gave a ring to",
    ]
    frame = pd.DataFrame(
        {"prompt": prompts, "answer": [" Mary", " John"], "distractor": [" John", " Mary"]}
    )
    frame.to_csv(good, index=False)
    frame = file_prompts(good, encoder, np.random.default_rng(0), 10)
    assert list(frame.corrupted_tokens[0]) == list(frame.clean_tokens[1])
    lonely = tmp_path / "lonely.jsonl"
    lonely.write_text('{"prompt": "Mary", "answer": " John", "distractor": " Mary"}\n')
    with pytest.raises(cf.ConfigError, match="row 1 has no corrupted_prompt"):
        file_prompts(lonely, encoder, np.random.default_rng(0), 10)


def test_dag_on_a_local_hugging_face_model(local_hf_results):
    """prefetch_model (a localrule), prompts, baseline and capture from a local text corpus
    through Snakemake, hub offline (the shared run: conftest's local_hf_results)."""
    results = local_hf_results
    log = (results.parent / "snakemake.log").read_text()
    assert "localrule prefetch_model" in log
    assert read_json(results / "model" / "model.json")["kind"] == "local_hf"
    for behaviour in ("ioi", "capitals"):
        summary = read_json(results / "baseline" / f"{behaviour}.json")
        assert summary["n_prompts"] > 0 and 0 <= summary["accuracy"] <= 1
    from circuitflow.capture.files import open_activations

    with open_activations(results / "activations" / "resid_post" / "layer_1.h5") as h5:
        assert h5["acts"].shape[1] == 32  # the tiny model's d_model
        assert h5.attrs["hook_name"] == "blocks.1.hook_resid_post"


@pytest.mark.parametrize("file", ["model.safetensors", "pytorch_model.bin"])
def test_a_local_directory_with_an_infinite_weight_is_refused_by_the_model_stage(
    tiny_hf_model_dir, tmp_path, file
):
    """The model stage reads every weight file of a local Hugging Face directory (safetensors,
    else PyTorch's .bin) and refuses one holding NaN or infinite values in one line naming the
    file and the tensor."""
    import shutil

    from safetensors.torch import load_file, save_file

    local = tmp_path / "tiny"
    shutil.copytree(tiny_hf_model_dir, local)
    weights = load_file(local / "model.safetensors")
    name = "transformer.h.1.mlp.c_fc.weight"
    weights[name][0, :2] = float("inf")
    weights[name][1, 0] = float("nan")
    if file.endswith(".bin"):
        (local / "model.safetensors").unlink()
        torch.save(weights, local / file)
    else:
        save_file(weights, local / file, metadata={"format": "pt"})
    with pytest.raises(cf.ConfigError) as err:
        prefetch(str(local))
    assert str(err.value) == (
        f"model.name: {local / file}: tensor '{name}' has 1 NaN value and 2 infinite values"
    )
