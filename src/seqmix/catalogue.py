"""The catalogue: every mixer and every task kind seqmix knows, in one place, without torch
(the Snakefile and the notebooks read it without loading torch). Adding a mixer is its
module plus one entry in ``MIXERS``, a task kind its module plus one line in ``TASKS``:
seqmix.mixers and seqmix.tasks, the config validation, the rules, the report's style and
every notebook read these tables, so a new entry is trained, analysed and drawn with no other
change. The order of ``MIXERS`` is that of every table and legend. What a mixer's class
states (its causal and non-causal forms, its options) is not repeated here.
"""

from __future__ import annotations

import dataclasses

COSTS_IN_L = ("L", "L log L", "L^2")  # the values of MixerEntry.cost_in_L


@dataclasses.dataclass(frozen=True, kw_only=True)
class MixerEntry:
    name: str  # the config's name for it (architectures: [...], mixers: {<name>: options})
    path: str  # "module:Class" of its seqmix.mixers.base.Mixer subclass (which states its
    #            causal / non-causal forms: supports_causal, supports_noncausal)
    title: str  # how tables and legends print it
    colour: str  # its colour in every figure, unique (a test holds them apart)
    # How its training cost (fwd+bwd FLOPs, bytes written, memory) grows with the sequence
    # length L at fixed width: "L", "L log L" or "L^2"; None = not stated. A test counts
    # every "L" / "L log L" mixer's fwd+bwd and fails when it grows faster (test_cost_count.py).
    cost_in_L: str | None = None
    # The block it trains in by default (``model.block: native``), its paper's own: one of
    # BLOCKS, built by seqmix/models/blocks.py. A config can force one block for all.
    block: str = "post"
    block_reason: str = ""  # why that block, with its source (docs/reference/blocks.md's table)


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    kind: str  # the config names a task "<kind>" or "<kind>/<variant>"
    path: str  # "module:Class" of its seqmix.tasks.base.Task subclass
    title: str  # how tables and figures print it


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
    MixerEntry(name="softmax", path="seqmix.mixers.softmax:SoftmaxAttention", title="Softmax", colour="#1f77b4",
               cost_in_L="L^2", block="post",
               block_reason="the Grassmann paper's Transformer block (Zhang 2025, arXiv:2512.19428, §3.2): "
                            "the setting of its claim"),
    MixerEntry(name="grassmann", path="seqmix.mixers.grassmann:CausalGrassmann", title="Grassmann", colour="#d62728",
               cost_in_L="L", block="post",
               block_reason="the paper's own (Zhang 2025, arXiv:2512.19428, §3.2); its gate replaces the residual "
                            "around the mixer"),
    MixerEntry(name="linear", path="seqmix.mixers.linear:LinearAttention", title="Linear (elu+1)", colour="#ff7f0e",
               cost_in_L="L", block="post",
               block_reason="a replacement of the attention inside an unchanged Transformer layer (Katharopoulos et "
                            "al. 2020, arXiv:2006.16236, §3.2; fast-transformers' encoder layer is post-LN)"),
    MixerEntry(name="performer", path="seqmix.mixers.performer:Performer", title="Performer", colour="#bcbd22",
               cost_in_L="L", block="post",
               block_reason="the same: FAVOR+ replaces softmax attention in an unchanged Transformer (Choromanski et "
                            "al. 2021, arXiv:2009.14794, §1)"),
    MixerEntry(name="sliding_window", path="seqmix.mixers.sliding_window:SlidingWindowAttention",
               title="Sliding window", colour="#2ca02c", cost_in_L="L", block="post",
               block_reason="Longformer replaces the attention of RoBERTa's post-LN layer (Beltagy et al. 2020, "
                            "arXiv:2004.05150, §4)"),
    MixerEntry(name="bigbird", path="seqmix.mixers.bigbird:BigBirdAttention", title="BigBird", colour="#17becf",
               cost_in_L="L", block="post",
               block_reason="BigBird replaces the attention of BERT/RoBERTa's post-LN layer (Zaheer et al. 2020, "
                            "arXiv:2007.14062, §4)"),
    MixerEntry(name="gla", path="seqmix.mixers.gla:GatedLinearAttention", title="GLA", colour="#9467bd",
               cost_in_L="L", block="pre",
               block_reason="the GLA Transformer is pre-norm, a GLA layer then a feed-forward (Yang et al. 2024, "
                            "arXiv:2312.06635, §4); its SwiGLU and RMSNorm are not reproduced"),
    MixerEntry(name="h3", path="seqmix.mixers.h3:H3", title="H3", colour="#8c564b",
               cost_in_L="L log L",  # FFT convolution
               block="pre",
               block_reason="H3's language models stack pre-norm blocks, the H3 layer then an MLP (Fu et al. 2023, "
                            "arXiv:2212.14052, §5)"),
    MixerEntry(name="mamba", path="seqmix.mixers.mamba:Mamba", title="Mamba", colour="#e377c2",
               cost_in_L="L", block="pre_rms",
               block_reason="`mamba_simple.py` Block + `MixerModel`: x + Mamba(RMSNorm(x)), no MLP, final RMSNorm, "
                            "out_proj scaled by 1/√n_layers (Gu & Dao 2023, arXiv:2312.00752)"),
    MixerEntry(name="tssa", path="seqmix.mixers.tssa:TokenStatisticsAttention", title="ToST (TSSA)",
               colour="#7f7f7f", cost_in_L="L", block="pre_layerscale",
               block_reason="ToST's Block (`tost_lang/model_TSSA.py`): pre-LN, LayerScale γ = 1e-5, `c_proj` "
                            "N(0, 0.02/√(2n)) (Wu et al. 2025, arXiv:2412.17810)"),
    MixerEntry(name="crate", path="seqmix.mixers.crate:CrateAttention", title="CRATE", colour="#393b79",
               cost_in_L="L^2", block="pre",
               block_reason="CRATE's own (`model/crate.py`): x + MSSA(LN(x)), then ISTA(LN(x)) with no residual, "
                            "which keeps ISTA's exact zeros (Yu et al. 2023, arXiv:2306.01129)"),
    # Linear in L, but its E/F projections have max_len rows: non-causal only.
    MixerEntry(name="linformer", path="seqmix.mixers.linformer:Linformer", title="Linformer", colour="#98df8a",
               cost_in_L="L", block="post",
               block_reason="Linformer replaces the attention of RoBERTa's post-LN layer (Wang et al. 2020, "
                            "arXiv:2006.04768, §5)"),
)

TASKS: tuple[TaskEntry, ...] = (
    TaskEntry("wikitext2", "seqmix.tasks.wikitext2:WikiText2", "WikiText-2"),
    TaskEntry("mqar", "seqmix.tasks.mqar:MQAR", "MQAR"),
    TaskEntry("snli", "seqmix.tasks.snli:SNLI", "SNLI"),
)


def mixer_names() -> list[str]:
    return [m.name for m in MIXERS]


def mixer_entry(name: str) -> MixerEntry:
    return _find(MIXERS, "name", name, "mixer")


def task_kinds() -> list[str]:
    return [t.kind for t in TASKS]


def task_entry(kind: str) -> TaskEntry:
    return _find(TASKS, "kind", kind, "task kind")


def _find(entries, key: str, value: str, what: str):
    for entry in entries:
        if getattr(entry, key) == value:
            return entry
    known = ", ".join(getattr(e, key) for e in entries)
    raise KeyError(f"unknown {what} {value!r}; the catalogue (seqmix/catalogue.py) has: {known}")


def kind_of(task_name: str) -> str:
    """The kind of a task named "<kind>" or "<kind>/<variant>[/<sweep point>]"."""
    return task_name.split("/", 1)[0]


def title(name: str) -> str:
    """The printed title of a mixer name or a task name (a variant keeps its suffix)."""
    if name in mixer_names():
        return mixer_entry(name).title
    kind, _, rest = name.partition("/")
    if kind in task_kinds():
        return task_entry(kind).title + (f" {rest}" if rest else "")
    return name


def imported(path: str):
    """The object named by "module:attribute", imported."""
    import importlib

    module_name, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_name), attribute)
