"""Cross-layer transcoders on disk: circuit-tracer's layout and Gemma Scope 2's, read from their
headers and checked against the run's model before any job, and decoder rows read by slices.
The module, its maths, load_clt and save_clt: sae.cross_layer; the memory plan:
sae.cross_layer_plan.

circuit-tracer 0.5.0's layout (`load_clt`, `CrossLayerTranscoder.to_safetensors`; a hub repo's
snapshot is such a folder): `config.yaml` (`model_kind: cross_layer_transcoder`,
`feature_input_hook`, `feature_output_hook`, block-relative TransformerLens hooks, defaults
hook_resid_mid and hook_mlp_out; `model_name`) and per layer i `W_enc_{i}.safetensors`
(`W_enc_{i}` [F, D], `b_enc_{i}` [F], `b_dec_{i}` [D], `threshold_{i}` [F] where JumpReLU: its
presence is the activation) and `W_dec_{i}.safetensors` (`W_dec_{i}` [F, L - i, D]). Two keys
circuit-tracer's loader does not read and so ignores: `activation` and `k` in config.yaml, as its
per-layer TopK transcoders' config.yaml has them (topk, and our batchtopk), and a skip
`W_skip_{i}` [D, D] in `W_enc_{i}.safetensors` (its own to_safetensors drops W_skip).

Gemma Scope 2's CLTs (circuit-tracer's `load_gemma_scope_2_clt`, chosen when config.yaml has
`transcoders`): one file a layer, `params_layer_{i}.safetensors` (the folder
google/gemma-scope-2-*/clt/<name>/ holds them), with `w_enc` [D, F], `w_dec` [F, L, D] (targets
by absolute layer: source i's are [:, i:, :]), `b_enc`, `b_dec`, `threshold` (JumpReLU) and an
optional `affine_skip_connection` [D, D] (x @ it). config.yaml (mwhanna's repos) lists the files
in layer order under `transcoders`: paths (relative to its folder) or hf:// URIs, read from the
Hugging Face cache; a folder of params_layer files without config.yaml reads as Gemma Scope 2's
own (its input the MLP's after the norm's weight, `mlp.hook_in`; output hook_mlp_out).

Every refusal is one line naming the file and the key. Nothing here imports torch at module
level: the plan and the header checks run where planning does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from circuitflow import inputs
from circuitflow.errors import InputError
from circuitflow.nodes import mlp_input

if TYPE_CHECKING:
    import torch

CONFIG_FILE = "config.yaml"
MODEL_KIND = "cross_layer_transcoder"
CIRCUIT_TRACER, GEMMA_SCOPE_2 = "circuit_tracer", "gemma_scope_2"
# safetensors' dtype names -> torch's, and bytes of one element; a CLT's tensors are floats.
DTYPES = {
    "F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
    "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1),
    "U8": ("uint8", 1), "BOOL": ("bool", 1),
}  # fmt: skip
FLOATS = ("float64", "float32", "float16", "bfloat16")
# Input hooks a CLT may read, by what they held in circuit-tracer's model (loaded unprocessed,
# fold_ln False): the residual before the MLP's norm, the normalised residual before the norm's
# weight (site mlp_in), or the MLP module's input after that weight (circuit-tracer adds
# `mlp.hook_in` and `mlp.hook_out` around each MLP; TransformerLens has neither).
INPUT_READS = {"hook_resid_mid": "residual", "hook_mlp_in": "residual",
               "ln2.hook_normalized": "normalised", "mlp.hook_in": "mlp"}  # fmt: skip
OUTPUT_HOOKS = ("hook_mlp_out", "mlp.hook_out")
ADDED_HOOKS = ("mlp.hook_in", "mlp.hook_out")


def encoder_file(layer: int) -> str:
    return f"W_enc_{layer}.safetensors"


def decoder_file(layer: int) -> str:
    return f"W_dec_{layer}.safetensors"


def gemma_scope_2_file(layer: int) -> str:
    return f"params_layer_{layer}.safetensors"


# --- the model a set must fit ---------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """What the checks compare a CLT with: the model's layers, d_model, hook names (empty: not
    checked) and norms as loaded (its normalization_type)."""

    n_layers: int
    d_model: int
    hook_names: frozenset[str] = frozenset()
    normalization: str | None = "LN"
    name: str = "the model"

    @classmethod
    def of(cls, model) -> ModelShape:
        """A TransformerLens model's shape."""
        cfg = model.cfg
        return cls(cfg.n_layers, cfg.d_model, frozenset(model.hook_dict),
                   cfg.normalization_type, str(cfg.model_name))  # fmt: skip


# --- safetensors headers, read without the tensors ------------------------------------------------
@dataclass(frozen=True)
class Stored:
    """One tensor as a file's header describes it."""

    file: Path
    key: str
    shape: tuple[int, ...]
    dtype: str  # torch's name

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * next(b for n, b in DTYPES.values() if n == self.dtype)


def header(path: Path) -> dict[str, Stored]:
    """The tensors of safetensors file `path` from its header alone (inputs.safetensors_header:
    each one's bytes checked to lie inside the file), with their sizes checked against their
    dtypes and shapes. InputError naming the file."""
    if not path.is_file():
        raise InputError(f"{path}: missing")
    out = {}
    for key, e in inputs.safetensors_header(path)[0].items():
        bad = f"{path}: not a readable safetensors file ({key}: "
        if e["dtype"] not in DTYPES:
            raise InputError(f"{bad}dtype {e['dtype']} unknown)")
        t = Stored(path, key, tuple(e["shape"]), DTYPES[e["dtype"]][0])
        start, end = e["data_offsets"]
        if end - start != t.nbytes:
            raise InputError(f"{bad}{end - start} bytes for shape {list(t.shape)})")
        out[key] = t
    return out


# --- a set on disk --------------------------------------------------------------------------------
@dataclass
class CltFiles:
    """A CLT on disk, read from its headers and checked (open_clt): per layer its encoder's
    tensors by role (W_enc, b_enc, b_dec, threshold, W_skip: circuit-tracer's names) and its
    decoder. `rows` reads decoder rows by safetensors slices (what a lazy CLT decodes with)."""

    folder: Path
    layout: str
    config_file: Path | None
    n_layers: int
    d_model: int
    d_transcoder: int
    activation: str
    k: int | list[int] | None
    feature_input_hook: str
    feature_output_hook: str
    model_name: str | None
    encoders: list[dict[str, Stored]]
    decoders: list[Stored]

    @property
    def skip(self) -> bool:
        return "W_skip" in self.encoders[0]

    @property
    def where(self) -> Path:
        """What messages name for the set's settings: config.yaml, else the folder."""
        return self.config_file or self.folder

    def _read(self, t: Stored, index=None):
        import torch
        from safetensors import safe_open

        with safe_open(t.file, framework="pt") as f:
            sl = f.get_slice(t.key)
            x = sl[:] if index is None else sl[index]
        if not torch.isfinite(x).all():
            bad = int((~torch.isfinite(x)).sum())
            raise InputError(f"{t.file}: {t.key} has {bad} non-finite values (NaN or Inf)")
        return x

    def encoder(self, layer: int) -> dict[str, torch.Tensor]:
        """Layer `layer`'s encoder tensors by role, as circuit-tracer holds them (W_enc [F, D],
        W_skip applied as x @ W_skip), checked finite."""
        out = {role: self._read(t) for role, t in self.encoders[layer].items()}
        if self.layout == GEMMA_SCOPE_2:
            out["W_enc"] = out["W_enc"].T.contiguous()  # stored [D, F]
        return out

    def rows(self, source: int, rows) -> torch.Tensor:
        """Rows `rows` (sorted, unique indices) of source layer `source`'s decoder,
        [len(rows), L - source, D], read by a safetensors slice (the file is not loaded);
        checked finite. A Gemma Scope 2 decoder's targets before `source` are left out."""
        index = rows.tolist() if hasattr(rows, "tolist") else list(rows)
        if self.layout == GEMMA_SCOPE_2:
            return self._read(self.decoders[source], (index, slice(source, None)))
        return self._read(self.decoders[source], index)

    def decoder(self, source: int) -> torch.Tensor:
        """Source layer `source`'s whole decoder [F, L - source, D], checked finite."""
        if self.layout == GEMMA_SCOPE_2:
            return self._read(self.decoders[source], (slice(None), slice(source, None)))
        return self._read(self.decoders[source])

    def check_finite(self, rows_a_read: int = 4096) -> None:
        """Every tensor read (decoders in slices of `rows_a_read` rows, so memory stays small)
        and refused, naming the file and key, where it holds a NaN or Inf."""
        for layer in range(self.n_layers):
            self.encoder(layer)
            for start in range(0, self.d_transcoder, rows_a_read):
                self.rows(layer, range(start, min(start + rows_a_read, self.d_transcoder)))


def _config(folder: Path) -> tuple[Path | None, dict[str, Any]]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        if (folder / gemma_scope_2_file(0)).is_file():
            return None, {}  # a copy of Gemma Scope 2's folder: its own hooks
        raise InputError(
            f"{path}: missing (a CLT folder holds config.yaml with model_kind: {MODEL_KIND}, "
            f"then {encoder_file(0)}, {decoder_file(0)}, ... or {gemma_scope_2_file(0)}, ...)"
        )
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise InputError(f"{path}: not readable YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise InputError(f"{path}: not a YAML mapping")
    if config.get("model_kind") != MODEL_KIND:
        raise InputError(
            f"{path}: model_kind {config.get('model_kind')!r} is not {MODEL_KIND} (a per-layer "
            "transcoder_set is read as published transcoders, sae.transcoders)"
        )
    return path, config


def _layer_paths(
    folder: Path,
    config_file: Path | None,
    config: dict,
    n_layers: int | None,
    resolve: Callable[[str], Path],
) -> tuple[str, list[tuple[Path, Path]]]:
    """The layout and each layer's (encoder file, decoder file)."""
    if "transcoders" in config:  # Gemma Scope 2's, listed in layer order
        entries = config["transcoders"]
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise InputError(f"{config_file}: transcoders is not a list of paths")
        if n_layers is not None and len(entries) != n_layers:
            raise InputError(f"{config_file}: transcoders lists {len(entries)} layers, the "
                             f"model has {n_layers}")  # fmt: skip
        paths = [resolve(e) if e.startswith("hf://") else folder / e for e in entries]
        return GEMMA_SCOPE_2, [(p, p) for p in paths]
    gemma = config_file is None
    pattern = r"params_layer_(\d+)\.safetensors" if gemma else r"W_enc_(\d+)\.safetensors"
    found = sorted(int(m[1]) for p in folder.iterdir() if (m := re.fullmatch(pattern, p.name)))
    count = n_layers if n_layers is not None else max(found, default=-1) + 1
    if count == 0:
        raise InputError(f"{folder / encoder_file(0)}: missing (no layer files)")
    if extra := [i for i in found if i >= count]:
        name = gemma_scope_2_file(extra[0]) if gemma else encoder_file(extra[0])
        raise InputError(f"{folder / name}: layer {extra[0]}, but the model has {count} layers")
    if gemma:
        return GEMMA_SCOPE_2, [(folder / gemma_scope_2_file(i),) * 2 for i in range(count)]
    return CIRCUIT_TRACER, [(folder / encoder_file(i), folder / decoder_file(i))
                            for i in range(count)]  # fmt: skip


def _stored(head: dict[str, Stored], file: Path, key: str, shape: Sequence[int], what: str,
            required: bool = True) -> Stored | None:  # fmt: skip
    t = head.get(key)
    if t is None:
        if required:
            raise InputError(f"{file}: no tensor {key} ({what})")
        return None
    if t.shape != tuple(shape):
        raise InputError(f"{file}: {key} has shape {list(t.shape)}, not {list(shape)} ({what})")
    if t.dtype not in FLOATS:
        raise InputError(f"{file}: {key} is {t.dtype}, not floating point ({what})")
    return t


def open_clt(folder: Path | str, model: ModelShape | None = None,
             resolve: Callable[[str], Path] | None = None) -> CltFiles:  # fmt: skip
    """The CLT in `folder` (either layout), its headers read and checked against `model` where
    given (layers, d_model, hooks, the input hook's norm: check_against): InputError in one
    line naming the file and key. `resolve` maps a config.yaml's hf:// entry to a local file
    (default: the Hugging Face cache, offline)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: no such directory (a cross-layer transcoder's folder)")
    config_file, config = _config(folder)
    n_layers = model.n_layers if model is not None else None
    layout, paths = _layer_paths(folder, config_file, config, n_layers, resolve or hub_file)
    gemma = layout == GEMMA_SCOPE_2
    L = len(paths)  # noqa: N806
    names = [("W_enc", "w_enc"), ("b_enc", "b_enc"), ("b_dec", "b_dec"),
             ("threshold", "threshold"), ("W_skip", "affine_skip_connection")]  # fmt: skip
    first = header(paths[0][0])
    w0 = first.get("w_enc" if gemma else "W_enc_0")
    if w0 is None or len(w0.shape) != 2:
        shape = list(w0.shape) if w0 else None
        raise InputError(f"{paths[0][0]}: {'w_enc' if gemma else 'W_enc_0'} has shape {shape}, "
                         f"not {'[D, F]' if gemma else '[F, D]'}")  # fmt: skip
    F, D = w0.shape[::-1] if gemma else w0.shape  # noqa: N806
    if model is not None and D != model.d_model:
        raise InputError(f"{paths[0][0]}: {w0.key} reads width {D}, but {model.name}'s d_model "
                         f"is {model.d_model}")  # fmt: skip
    shapes = {"W_enc": (D, F) if gemma else (F, D), "b_enc": (F,), "b_dec": (D,),
              "threshold": (F,), "W_skip": (D, D)}  # fmt: skip
    has = {role: (key if gemma else f"{role}_0") in first for role, key in names}
    encoders, decoders = [], []
    for i, (enc_path, dec_path) in enumerate(paths):
        head = header(enc_path)
        layer = {}
        for role, gemma_key in names:
            key = gemma_key if gemma else f"{role}_{i}"
            optional = role in ("threshold", "W_skip")
            if optional and (key in head) != has[role]:
                present = "has" if key in head else "lacks"
                raise InputError(f"{enc_path}: {present} {key}, unlike layer 0: every layer's "
                                 "activation and skip must be the same")  # fmt: skip
            what = f"layer {i}'s {role}, F = {F} and D = {D} as layer 0's"
            t = _stored(head, enc_path, key, shapes[role], what, not optional)
            if t is not None:
                layer[role] = t
        dec_head = header(dec_path)
        dec_key, dec_shape = ("w_dec", (F, L, D)) if gemma else (f"W_dec_{i}", (F, L - i, D))
        what = f"[F, {'L' if gemma else 'L - i'}, D] with L = {L}, F = {F}, D = {D}"
        decoders.append(_stored(dec_head, dec_path, dec_key, dec_shape, what))
        encoders.append(layer)
    activation, k = _activation(config_file or folder, config, has["threshold"], gemma, L, F)
    default_in = "mlp.hook_in" if gemma else "hook_resid_mid"
    files = CltFiles(
        folder, layout, config_file, L, D, F, activation, k,
        str(config.get("feature_input_hook", default_in)),
        str(config.get("feature_output_hook", "hook_mlp_out")),
        config.get("model_name"), encoders, decoders,
    )  # fmt: skip
    if model is not None:
        check_against(files, model)
    return files


def _activation(where: Path, config: dict, threshold: bool, gemma: bool, L: int, F: int):  # noqa: N803
    """(activation, k): config.yaml's `activation` (and `k`), else circuit-tracer's rule."""
    given = config.get("activation")
    activation = given or ("jumprelu" if threshold else "relu")
    if activation not in ("relu", "jumprelu", "topk", "batchtopk"):
        raise InputError(f"{where}: activation {given!r} is not relu, jumprelu, topk or batchtopk")
    if gemma and not threshold:
        raise InputError(f"{where}: Gemma Scope 2's CLTs are JumpReLU, but the layer files "
                         "lack threshold")  # fmt: skip
    if gemma and activation != "jumprelu" or (activation == "jumprelu") != threshold:
        raise InputError(f"{where}: activation {activation} but the layer files "
                         f"{'have' if threshold else 'lack'} a threshold")  # fmt: skip
    if activation not in ("topk", "batchtopk"):
        return activation, None
    k = config.get("k")
    ks = [k] * L if isinstance(k, int) else k
    if (
        not isinstance(ks, list)
        or len(ks) != L
        or not all(isinstance(v, int) and 0 < v <= F for v in ks)
    ):
        raise InputError(f"{where}: k {k!r}: activation {activation} needs k, an integer in "
                         f"1..{F} or a list of {L}, one a layer")  # fmt: skip
    return activation, k


def check_against(files: CltFiles, model: ModelShape) -> bool:
    """Refuse, in one line naming config.yaml's key, a CLT that does not fit `model`: its
    layers and width (open_clt checks those), hooks that are not the model's, and an input
    read after the MLP's norm weight where the model is loaded with its norms folded (the
    weight is gone: sae.pretrained.folds_norm's rule for per-layer transcoders). Returns
    whether each layer's ln2 weight (and bias) must be folded into its encoder for it to read
    site mlp_in (CrossLayerTranscoder.fold_input_norm): an input after the weight, on a
    model loaded with its norms unfolded."""
    if files.n_layers != model.n_layers or files.d_model != model.d_model:
        raise InputError(f"{files.folder}: {files.n_layers} layers of width {files.d_model}, "
                         f"but {model.name} has {model.n_layers} of {model.d_model}")  # fmt: skip
    for key, hook in (("feature_input_hook", files.feature_input_hook),
                      ("feature_output_hook", files.feature_output_hook)):  # fmt: skip
        allowed = tuple(INPUT_READS) if key == "feature_input_hook" else OUTPUT_HOOKS
        if hook not in allowed:
            side = "input" if key == "feature_input_hook" else "output"
            raise InputError(f"{files.where}: {key} {hook!r} is not an MLP {side} hook (one of "
                             f"{', '.join(allowed)})")  # fmt: skip
        if not model.hook_names:
            continue
        for layer in range(model.n_layers):
            # circuit-tracer's own hooks exist wherever the block has an MLP.
            name = f"blocks.{layer}.{'hook_mlp_out' if hook in ADDED_HOOKS else hook}"
            if name not in model.hook_names:
                raise InputError(f"{files.where}: {key} {hook!r}: {name} is not a hook of "
                                 f"{model.name}")  # fmt: skip
    if INPUT_READS[files.feature_input_hook] != "mlp" or model.normalization is None:
        return False  # without norms the MLP's input is the residual
    if not mlp_input(model.normalization).norm_after:
        raise InputError(
            f"{files.where}: feature_input_hook mlp.hook_in read the MLP's input after its "
            "norm's weight (circuit-tracer loads models with fold_ln False), but the run's model "
            f"is loaded with its norms folded ({model.normalization}): load the model unfolded"
        )
    return True


def hub_file(uri: str, hf_cache: str | None = None) -> Path:
    """The local copy of hf://org/repo/path[?revision=...] in the Hugging Face cache, without
    the network; InputError naming it where the cache lacks it (the prefetch fetches it)."""
    from huggingface_hub import try_to_load_from_cache

    from circuitflow.published import hub_cache_dir

    m = re.fullmatch(r"hf://([^/]+/[^/]+)/([^?]+)(?:\?revision=(.+))?", uri)
    if m is None:
        raise InputError(f"{uri}: not an hf://org/repo/path URI")
    found = try_to_load_from_cache(m[1], m[2], cache_dir=hub_cache_dir(hf_cache), revision=m[3])
    if not isinstance(found, str):
        raise InputError(f"{uri}: not in the Hugging Face cache; prefetch it on a machine with "
                         "internet")  # fmt: skip
    return Path(found)
