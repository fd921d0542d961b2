"""The catalogue: every mixer and every task kind seqmix knows, in one place, without torch.

Adding a mixer is its module in ``seqmix.mixers`` (or any importable package) plus one
line in ``MIXERS``; adding a task kind is its module plus one line in ``TASKS``. The
registry (``seqmix.mixers``, ``seqmix.tasks``), the config validation, the Snakemake rules,
the report's style and every notebook read these tables, so a new entry is trained,
analysed and drawn with no other change. The order of ``MIXERS`` is the order of every
table and legend of the report.

This module imports nothing beyond the standard library: the Snakefile and the notebooks
read it without loading torch.
"""

from __future__ import annotations

import dataclasses

COSTS_IN_L = ("L", "L log L", "L^2")  # the values of MixerEntry.cost_in_L


@dataclasses.dataclass(frozen=True)
class MixerEntry:
    name: str  # the config's name for it (architectures: [...], mixers: {<name>: options})
    path: str  # "module:Class" of its seqmix.mixers.base.Mixer subclass
    label: str  # how tables and legends print it
    causal: bool  # has a causal form: trains language models (a test holds these flags
    noncausal: bool  # equal to the class's supports_causal / supports_noncausal)
    colour: str  # its colour in every figure
    # How its training cost (fwd+bwd FLOPs, bytes written, memory) grows with the sequence
    # length L at fixed width: "L", "L log L" or "L^2"; None = not stated. A test counts
    # every "L" / "L log L" mixer's fwd+bwd and fails when it grows faster (test_cost_count.py).
    cost_in_L: str | None = None
    # The block it trains in by default (``model.block: native``), its paper's own: one of
    # BLOCKS, built by seqmix/models/blocks.py. A config can force one block for all.
    block: str = "post"


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    kind: str  # the config names a task "<kind>" or "<kind>/<variant>"
    path: str  # "module:Class" of its seqmix.tasks.base.Task subclass
    label: str  # how tables and figures print it


# The residual blocks a mixer can sit in (seqmix/models/blocks.py has their equations):
#   post            the Grassmann paper's post-LN Transformer block (Zhang 2025, §3.2)
#   pre             pre-LN: x + f(LN(x)) around the mixer and around the feed-forward
#   pre_layerscale  pre-LN with LayerScale γ (init 1e-5) on both branches (ToST's)
#   pre_rms         x + mixer(RMSNorm(x)), no feed-forward (Mamba's)
BLOCKS: tuple[str, ...] = ("post", "pre", "pre_layerscale", "pre_rms")

# The architecture the others are measured against where a comparison needs one reference
# (the throughput benchmark's ratios).
BASELINE = "softmax"

MIXERS: tuple[MixerEntry, ...] = (
    MixerEntry("softmax", "seqmix.mixers.softmax:SoftmaxAttention", "Softmax", True, True, "#1f77b4", "L^2", "post"),
    MixerEntry("grassmann", "seqmix.mixers.grassmann:CausalGrassmann", "Grassmann", True, True, "#d62728", "L", "post"),
    MixerEntry("linear", "seqmix.mixers.linear:LinearAttention", "Linear (elu+1)", True, True, "#ff7f0e", "L", "post"),
    MixerEntry("performer", "seqmix.mixers.performer:Performer", "Performer", True, True, "#bcbd22", "L", "post"),
    MixerEntry("sliding_window", "seqmix.mixers.sliding_window:SlidingWindowAttention", "Sliding window", True, True, "#2ca02c", "L", "post"),
    MixerEntry("bigbird", "seqmix.mixers.bigbird:BigBirdAttention", "BigBird", True, True, "#17becf", "L", "post"),
    MixerEntry("gla", "seqmix.mixers.gla:GatedLinearAttention", "GLA", True, False, "#9467bd", "L", "pre"),
    MixerEntry("h3", "seqmix.mixers.h3:H3", "H3", True, False, "#8c564b", "L log L", "pre"),  # FFT convolution
    MixerEntry("mamba", "seqmix.mixers.mamba:Mamba", "Mamba", True, False, "#e377c2", "L", "pre_rms"),
    MixerEntry("tssa", "seqmix.mixers.tssa:TokenStatisticsAttention", "ToST (TSSA)", True, True, "#7f7f7f", "L", "pre_layerscale"),
    MixerEntry("crate", "seqmix.mixers.crate:CrateAttention", "CRATE", True, True, "#393b79", "L^2", "pre"),
    # Linear in L, but its E/F projections have max_len rows: non-causal only.
    MixerEntry("linformer", "seqmix.mixers.linformer:Linformer", "Linformer", False, True, "#98df8a", "L", "post"),
)

TASKS: tuple[TaskEntry, ...] = (
    TaskEntry("wikitext2", "seqmix.tasks.wikitext2:WikiText2", "WikiText-2"),
    TaskEntry("mqar", "seqmix.tasks.mqar:MQAR", "MQAR"),
    TaskEntry("snli", "seqmix.tasks.snli:SNLI", "SNLI"),
)


def mixer_names() -> list[str]:
    return [m.name for m in MIXERS]


def mixer_entry(name: str) -> MixerEntry:
    for m in MIXERS:
        if m.name == name:
            return m
    raise KeyError(f"unknown mixer {name!r}; the catalogue (seqmix/catalogue.py) has: {', '.join(mixer_names())}")


def task_kinds() -> list[str]:
    return [t.kind for t in TASKS]


def task_entry(kind: str) -> TaskEntry:
    for t in TASKS:
        if t.kind == kind:
            return t
    raise KeyError(f"unknown task kind {kind!r}; the catalogue (seqmix/catalogue.py) has: {', '.join(task_kinds())}")


def kind_of(task_name: str) -> str:
    """The kind of a task named "<kind>" or "<kind>/<variant>[/<sweep point>]"."""
    return task_name.split("/", 1)[0]


def label(name: str) -> str:
    """The printed label of a mixer name or a task name (a variant keeps its suffix)."""
    if name in mixer_names():
        return mixer_entry(name).label
    kind, _, rest = name.partition("/")
    if kind in task_kinds():
        return task_entry(kind).label + (f" {rest}" if rest else "")
    return name


def load(path: str):
    """The object named by "module:attribute"."""
    import importlib

    module_name, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_name), attribute)
