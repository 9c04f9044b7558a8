"""Hook names and node identity: the one place that spells them.

A node is something attribution scores and interventions ablate: the token embedding, an
attention head (a slice of `blocks.{l}.attn.hook_z`), an MLP output (`blocks.{l}.hook_mlp_out`),
an SAE feature or an SAE's error term at a hook site (`blocks.{l}.hook_{site}`). Its id is what
graph.json, summary.json and the parquet tables use: `embedding`, `head.{l}.{h}`, `mlp.{l}`,
`feature.{site}.{l}.{f}`, `error.{site}.{l}`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_in", "mlp_out")
# Where a site sits inside its layer's forward pass (resid_pre before the heads, resid_post last).
SITE_ORDER = {
    "resid_pre": 0.0,
    "attn_out": 0.4,
    "resid_mid": 0.5,
    "mlp_in": 0.6,
    "mlp_out": 0.9,
    "resid_post": 1.0,
}
# Site mlp_in is what a block's MLP reads, up to its norm's weight: the one place that decides
# which hook holds it on a model as it is loaded is `mlp_input` below.
_MLP_IN = "ln2.hook_normalized"
_RESID_MID = "hook_resid_mid"
EMBED_HOOK = "hook_embed"
KINDS = ("embedding", "head", "mlp", "feature", "error")
# TransformerLens's normalization_type of a model loaded with its norms' weights in place (LN:
# weight and bias; RMS: weight), and of one whose weights were folded into the next layer's.
UNFOLDED_NORMS = ("LN", "RMS")
FOLDED_NORMS = ("LNPre", "RMSPre")


@dataclass(frozen=True)
class MlpInput:
    """Where site mlp_in reads in block L of a model as it is loaded: `hook` (the hook's name
    inside the block) and `norm_after`, whether the block's pre-MLP norm (ln2) still applies its
    weight (and LayerNorm's bias) between that hook and the MLP. With the norms unfolded the MLP
    receives `ln2.w * x + ln2.b` of the hook's x: a transcoder trained here reads x, its encoder
    absorbing that affine map (as TransformerLens's fold_ln folds it into the MLP's W_in); one
    published after it gets the map folded into its encoder when loaded (sae.pretrained). With
    the norms folded the hook is exactly what the MLP receives."""

    hook: str
    norm_after: bool


def mlp_input(normalization: str | None = "LN") -> MlpInput:
    """Site mlp_in on a model whose norms are `normalization` as it is loaded (its
    HookedTransformerConfig.normalization_type): ln2.hook_normalized, the normalised residual
    before ln2's weight, which the norm's weight follows unless it was folded; in a model
    without norms (None: a TransformerLens checkpoint may have none) the residual stream the MLP
    reads as it is, hook_resid_mid (its ln2 is an identity without hooks). ValueError for
    another value."""
    if normalization in UNFOLDED_NORMS:
        return MlpInput(_MLP_IN, norm_after=True)
    if normalization in FOLDED_NORMS:
        return MlpInput(_MLP_IN, norm_after=False)
    if normalization is None:
        return MlpInput(_RESID_MID, norm_after=False)
    raise ValueError(
        f"normalization_type {normalization!r}: site mlp_in reads the MLP's norm ({_MLP_IN}), "
        f"and TransformerLens has no such norm; known: {', '.join(UNFOLDED_NORMS + FOLDED_NORMS)}"
    )


def hook_names(site: str, layer: int) -> tuple[str, ...]:
    """Every hook `site` at `layer` is at on some model (hook_name's answers), for a file that
    records its hook without its model: mlp_in is two (with norms and without), the rest one."""
    norms = (*UNFOLDED_NORMS, *FOLDED_NORMS, None)
    return tuple(dict.fromkeys(hook_name(site, layer, n) for n in norms))


def hook_name(site: str, layer: int, normalization: str | None = "LN") -> str:
    """TransformerLens's hook of `site` at `layer`: blocks.{layer}.hook_{site}, and for mlp_in
    the hook mlp_input names on a model whose norms are `normalization` (callers that hold the
    model pass its cfg.normalization_type): blocks.{layer}.ln2.hook_normalized, or without norms
    blocks.{layer}.hook_resid_mid."""
    if site not in SITES:
        raise ValueError(f"sites: {site!r} is not allowed; allowed values: {', '.join(SITES)}")
    if site == "mlp_in":
        return f"blocks.{int(layer)}.{mlp_input(normalization).hook}"
    return f"blocks.{int(layer)}.hook_{site}"


def site_layer(hook: str) -> tuple[str, int]:
    """(site, layer) of a hook_name: the inverse of hook_name (mlp_in of a model without norms,
    its resid_mid hook, reads as resid_mid: the same tensor)."""
    if m := re.fullmatch(rf"blocks\.(\d+)\.{re.escape(_MLP_IN)}", hook):
        return "mlp_in", int(m[1])
    m = re.fullmatch(r"blocks\.(\d+)\.hook_(\w+)", hook)
    if not m or m[2] not in SITES or m[2] == "mlp_in":  # hook_mlp_in is not site mlp_in
        raise ValueError(f"{hook!r} is not a hook site name (blocks.<layer>.hook_<site>)")
    return m[2], int(m[1])


def head_hook(layer: int) -> str:
    return f"blocks.{int(layer)}.attn.hook_z"


def mlp_hook(layer: int) -> str:
    return f"blocks.{int(layer)}.hook_mlp_out"


# A published dictionary's features on Neuronpedia: its id there (SAELens's `neuronpedia_id`,
# e.g. qwen3-0.6b/0-transcoder-hp-lowl0) names the dictionary; a feature's page is the id, then
# the feature's index.
NEURONPEDIA = "https://www.neuronpedia.org"


def neuronpedia_pages(neuronpedia_id: str | None) -> str | None:
    """Where a dictionary's features' Neuronpedia pages are (each: this, then its index), from
    the dictionary's Neuronpedia id (None: none)."""
    return f"{NEURONPEDIA}/{neuronpedia_id}/" if neuronpedia_id else None


def neuronpedia_url(neuronpedia_id: str | None, feature: int) -> str | None:
    """A feature's Neuronpedia page, from its dictionary's Neuronpedia id (None: none)."""
    pages = neuronpedia_pages(neuronpedia_id)
    return f"{pages}{int(feature)}" if pages else None


def dictionary_anchor(site: str, layer: int) -> str:
    """A dictionary's anchor in the report's feature browser (`resid_post.1`); its features'
    are `Node.anchor` (`resid_post.1.f355`)."""
    return f"{site}.{int(layer)}"


# The report's feature browser: this index (report/features.html) lists every dictionary and
# links to its page, dictionary_page, relative to the index's folder.
BROWSER_INDEX = "features.html"


def dictionary_page(site: str, layer: int) -> str:
    """A dictionary's page of the report's feature browser, relative to the browser's index
    (report/features.html): `features/resid_post/layer_1.html`. The one place the layout is
    spelled: the report writes the pages here and every graph page links its features here."""
    return f"features/{site}/layer_{int(layer)}.html"


@dataclass(frozen=True, order=True)
class Node:
    """One node. `layer` is -1 for the embedding; `index` the head or feature, else -1; `site`
    the hook site of SAE nodes, else ""."""

    kind: str  # embedding | head | mlp | feature | error
    layer: int = -1
    index: int = -1
    site: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown node kind {self.kind!r}; allowed: {', '.join(KINDS)}")

    @classmethod
    def of(cls, kind: str, layer=-1, index=-1, site=None) -> Node:
        """A node from table columns (numpy ints, None or NaN sites); index and site are dropped
        where the kind has none."""
        has_index = kind in ("head", "feature")
        has_site = kind in ("feature", "error")
        return cls(
            kind,
            int(layer) if kind != "embedding" else -1,
            int(index) if has_index else -1,
            str(site) if has_site else "",
        )

    @property
    def id(self) -> str:
        return {
            "embedding": "embedding",
            "head": f"head.{self.layer}.{self.index}",
            "mlp": f"mlp.{self.layer}",
            "feature": f"feature.{self.site}.{self.layer}.{self.index}",
            "error": f"error.{self.site}.{self.layer}",
        }[self.kind]

    @property
    def hook(self) -> str:
        """The hook whose activation holds this node."""
        if self.kind == "embedding":
            return EMBED_HOOK
        if self.kind == "head":
            return head_hook(self.layer)
        if self.kind == "mlp":
            return mlp_hook(self.layer)
        return hook_name(self.site, self.layer)

    @property
    def label(self) -> str:
        """Short human label: emb, L1H2, MLP0, resid_post0/F12, resid_post0/err."""
        return {
            "embedding": "emb",
            "head": f"L{self.layer}H{self.index}",
            "mlp": f"MLP{self.layer}",
            "error": f"{self.site}{self.layer}/err",
        }.get(self.kind, f"{self.site}{self.layer}/F{self.index}")

    @property
    def anchor(self) -> str:
        """A feature's card on its dictionary's page of the report's feature browser
        (`resid_post.1.f355`; the page: `card`)."""
        if self.kind != "feature":
            raise ValueError(f"only a feature has a card in the feature browser, not {self.id}")
        return f"{dictionary_anchor(self.site, self.layer)}.f{self.index}"

    @property
    def card(self) -> str:
        """A feature's card relative to the feature browser's index (report/features.html):
        `features/resid_post/layer_1.html#resid_post.1.f355`."""
        return f"{dictionary_page(self.site, self.layer)}#{self.anchor}"

    @property
    def order(self) -> float:
        """Position in the forward pass (embedding first; heads, then MLP, within a layer; an
        SAE node just after its site)."""
        if self.kind == "embedding":
            return -1.0
        if self.kind == "head":
            return self.layer + 0.3
        if self.kind == "mlp":
            return self.layer + 0.8
        return self.layer + SITE_ORDER[self.site] + 0.05

    @classmethod
    def parse(cls, node_id: str) -> Node:
        if node_id == "embedding":
            return cls("embedding")
        if m := re.fullmatch(r"head\.(\d+)\.(\d+)", node_id):
            return cls("head", int(m[1]), int(m[2]))
        if m := re.fullmatch(r"mlp\.(\d+)", node_id):
            return cls("mlp", int(m[1]))
        if m := re.fullmatch(r"feature\.(\w+)\.(\d+)\.(\d+)", node_id):
            return cls("feature", int(m[2]), int(m[3]), m[1])
        if m := re.fullmatch(r"error\.(\w+)\.(\d+)", node_id):
            return cls("error", int(m[2]), -1, m[1])
        raise ValueError(f"cannot parse node id {node_id!r}")


def head_nodes(n_layers: int, n_heads: int) -> list[Node]:
    return [Node("head", layer, h) for layer in range(n_layers) for h in range(n_heads)]


def component_nodes(n_layers: int, n_heads: int, mlps: bool = True) -> list[Node]:
    """Embedding, every head and every MLP (none where not `mlps`: an attention-only model),
    in forward order."""
    nodes = [Node("embedding")]
    for layer in range(n_layers):
        nodes += [Node("head", layer, h) for h in range(n_heads)]
        if mlps:
            nodes.append(Node("mlp", layer))
    return nodes
