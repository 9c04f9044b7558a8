"""Where a run's dictionaries come from (`sae.source`): one record per source, in one registry.

The workflow and the planners ask the run's record (`get(config)`) instead of comparing names:
whether capture's activation files are made and read, how large the token set is, which rules
make the dictionaries and with which plan, whether they are grouped, trained or evaluated.
Adding a source is its module (its stage and plan, under circuitflow.sae, and its script),
one `register` line below and the name in the schema's enum of `sae.source`
(workflow/schemas/config.schema.yaml; tests/test_dictionary_sources.py checks they agree).

A low floor: capture's token set and disk plan ask it too, and those sit below circuitflow.sae.
So a record names its plan and entry point by module (`plan`, `entry_point`) rather than
importing them; the rule table (circuitflow.resources), above both, imports the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from circuitflow.errors import ConfigError
from circuitflow.sites import dictionary_sites


@dataclass(frozen=True)
class DictionarySource:
    """One value of `sae.source`: what makes its dictionaries and what that reads."""

    name: str  # the value of sae.source
    description: str  # one line, for the docs and messages
    # The rule that writes its dictionaries, saes/{site}/layer_{layer}/: one job per site and
    # layer, or (grouped) one rule per group of them named `<rule>_<group>`.
    rule: str
    # The module of that rule's plan (job_bytes and job_work, resources.Rule.plan; a grouped
    # source's also `members(config)`, the dictionaries it splits into groups, by layer).
    plan: str
    script: str  # scripts/<script>.py: what the rule's shell runs
    entry_point: str  # `module:function` that script calls
    # Whether its jobs read capture's activation files (the capture rules run, and attribution
    # takes the features' top contexts from them); else nothing is captured to disk.
    reads_activation_files: bool
    # Whether its jobs read the token set (capture_tokens' files) themselves.
    needs_token_set: bool
    # Whether the token set holds its training rows (sae.total_tokens, and sae.eval_contexts
    # contexts held out) rather than capture.n_tokens.
    trains_on_token_set: bool
    # Whether its jobs each take a group of sites and layers (sae.stream.layers_per_job;
    # circuitflow.stream_groups), the model loaded once for all of them.
    grouped: bool
    # Whether a grouped job holds every member at once (its groups sized to the GPU's memory
    # by its plan's `group_bytes`), or one at a time.
    holds_group: bool
    # Whether it trains its dictionaries (resumable from checkpoints on SIGTERM) or evaluates
    # ones made elsewhere.
    trains: bool
    kinds: tuple[str, ...]  # the sae.kind values it makes
    # Config keys whose edit can change its dictionaries' weights (a section stands for all of
    # its keys), less `kept_keys` inside them; its inputs (model, token set, activation files)
    # are told apart by their own hashes. What a resume fingerprint covers.
    dictionary_keys: tuple[str, ...]
    kept_keys: tuple[str, ...] = ()
    prefetch_rule: str | None = None  # a login-node localrule that fetches its inputs first

    @property
    def rules(self) -> tuple[str, ...]:
        """Every rule of its own: the prefetch (where it has one) and the dictionaries'."""
        return (self.prefetch_rule, self.rule) if self.prefetch_rule else (self.rule,)

    @property
    def token_set_key(self) -> str:
        """The config key that sizes the token set."""
        return "sae.total_tokens" if self.trains_on_token_set else "capture.n_tokens"

    def changes_dictionaries(self, key: str) -> bool:
        """Whether editing config key `key` (dotted: `sae.lr`, `sae.stream`) can change its
        dictionaries' weights."""

        def within(k: str, section: str) -> bool:
            return k == section or k.startswith(section + ".")

        return any(within(key, s) for s in self.dictionary_keys) and not any(
            within(key, s) for s in self.kept_keys
        )


# Keys of a trained dictionary's config that change no weight: the checkpoint cadence, the
# evaluation's contexts, and the other sources' settings.
TRAINING_KEPT = (
    "sae.checkpoint_every_tokens", "sae.eval_contexts", "sae.stream", "sae.pretrained",
    "sae.transcoders",
)  # fmt: skip

SOURCES: dict[str, DictionarySource] = {}


def register(source: DictionarySource) -> DictionarySource:
    SOURCES[source.name] = source
    return source


register(
    DictionarySource(
        name="capture",
        description="trained from the capture stage's activation files, one job per site and layer",
        rule="train_sae",
        plan="circuitflow.sae.plan",
        script="train_sae",
        entry_point="circuitflow.sae.stage:run",
        reads_activation_files=True,
        needs_token_set=False,
        trains_on_token_set=False,
        grouped=False,
        holds_group=False,
        trains=True,
        kinds=("sae", "transcoder", "both"),
        dictionary_keys=("seed", "sae"),
        kept_keys=TRAINING_KEPT,
    )
)
register(
    DictionarySource(
        name="stream",
        description="trained from activations its jobs compute over the token set, a group of "
        "sites and layers a job",
        rule="train_sae_stream",
        plan="circuitflow.sae.stream_plan",
        script="train_sae_stream",
        entry_point="circuitflow.sae.stream_stage:run",
        reads_activation_files=False,
        needs_token_set=True,
        trains_on_token_set=True,
        grouped=True,
        holds_group=True,
        trains=True,
        kinds=("sae", "transcoder", "both"),
        # The stream's rows: whether BOS is left out, and the dtype they are buffered in.
        dictionary_keys=("seed", "sae", "capture.exclude_bos", "capture.dtype"),
        kept_keys=TRAINING_KEPT,
    )
)
register(
    DictionarySource(
        name="pretrained",
        description="published dictionaries (sae.pretrained), evaluated on the token set; "
        "nothing trained",
        rule="pretrained_sae",
        plan="circuitflow.sae.pretrained_plan",
        script="pretrained_sae",
        entry_point="circuitflow.sae.pretrained_stage:run_group",
        reads_activation_files=False,
        needs_token_set=True,
        trains_on_token_set=False,
        grouped=True,
        holds_group=False,
        trains=False,
        kinds=("sae", "transcoder", "both"),
        dictionary_keys=("sae.pretrained", "sae.transcoders"),
        prefetch_rule="prefetch_saes",
    )
)


def names() -> tuple[str, ...]:
    return tuple(SOURCES)


def named(name: str) -> DictionarySource:
    """The source called `name`; ConfigError naming sae.source and the known sources."""
    try:
        return SOURCES[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"sae.source: {name!r} is not a dictionary source; known: {', '.join(SOURCES)}"
        ) from None


def get(config: dict) -> DictionarySource:
    """The source of a resolved config (its `sae.source`): every dictionary's, but with
    sae.kind both the transcoders' where sae.transcoders.source names another (`source_of`)."""
    return named(config["sae"]["source"])


# --- a run whose SAEs and transcoders come from different sources ---------------------------------
def transcoders_apart(config: dict) -> bool:
    """Whether sae.kind both takes its transcoders from sae.transcoders (their source, and
    where published which ones), apart from the SAEs' sae.source and sae.pretrained."""
    sae = config["sae"]  # a job's section may hold only what it reads: nothing apart there
    apart = (sae.get("transcoders") or {}).get("source")
    return sae.get("kind") == "both" and apart is not None


def source_of(config: dict, site: str) -> DictionarySource:
    """The source of the dictionary at `site`: the transcoders' (mlp_out) sae.transcoders.source
    where set (sae.kind both), every other's sae.source."""
    if site == "mlp_out" and transcoders_apart(config):
        return named(config["sae"]["transcoders"]["source"])
    return get(config)


def used(config: dict) -> list[DictionarySource]:
    """The sources a run's dictionaries come from (the SAEs' first), each once."""
    found = [config["sae"]["source"]]
    if transcoders_apart(config):
        found.append(config["sae"]["transcoders"]["source"])
    return [named(name) for name in dict.fromkeys(found)]


def part(config: dict, source: DictionarySource) -> dict:
    """`config` as a run of `source`'s dictionaries alone would have it: its sites, sae.kind and
    sae.source (`config` itself where every dictionary of the run comes from `source`). What
    its rules, plans and jobs read, so each source's code sees a run of one source."""
    if [s.name for s in used(config)] == [source.name]:
        return config
    sites = [s for s in dictionary_sites(config) if source_of(config, s).name == source.name]
    # sae.transcoders stays: published transcoders are read from it (published.section_of).
    kind = "transcoder" if sites == ["mlp_out"] else "sae"
    return {**config, "sites": sites, "sae": dict(config["sae"], source=source.name, kind=kind)}


def part_of_rule(config: dict, rule: str) -> dict:
    """The part of the run (`part`) whose source's rules include `rule`; the run itself for any
    other rule."""
    source = of_rule(rule)
    if source is None or source.name not in {s.name for s in used(config)}:
        return config
    return part(config, source)


def run_reads_activation_files(config: dict) -> bool:
    """Whether any of the run's sources reads capture's activation files."""
    return any(s.reads_activation_files for s in used(config))


def run_needs_token_set(config: dict) -> bool:
    """Whether any of the run's sources reads the token set itself."""
    return any(s.needs_token_set for s in used(config))


def capture_part(config: dict) -> dict:
    """The part of the run whose dictionaries are made from capture's activation files (what
    capture writes for), the run itself where none or all are."""
    reading = [s for s in used(config) if s.reads_activation_files]
    return part(config, reading[0]) if reading else config


def token_set_source(config: dict) -> DictionarySource:
    """The source the token set is sized for: one that trains on it where the run has one
    (sae.total_tokens), else the run's first (capture.n_tokens)."""
    sources = used(config)
    return next((s for s in sources if s.trains_on_token_set), sources[0])


def making(kind: str) -> list[str]:
    """The sources that make dictionaries of sae.kind `kind`."""
    return [s.name for s in SOURCES.values() if kind in s.kinds]


def reading(key: str) -> list[str]:
    """The sources whose dictionaries config key `key` can change."""
    return [s.name for s in SOURCES.values() if s.changes_dictionaries(key)]


def of_rule(rule: str) -> DictionarySource | None:
    """The source one of whose rules is `rule` (the first registered), else None."""
    return next((s for s in SOURCES.values() if rule in s.rules), None)
