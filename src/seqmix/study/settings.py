"""The settings of every section of a profile as typed, frozen pydantic models: what every
key means, its type, its bounds and its default, in one place.

A task kind's own settings are a ``TaskSettings`` subclass on its Task class (seqmix/tasks/),
a mixer's options the ``Options`` dataclass of its module (seqmix/mixers/); seqmix.expansion.validate
puts them together and validates a profile (as seqmix.study.profile reads it) against the whole.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    field_validator,
    model_serializer,
    model_validator,
)

from seqmix import REPO_ROOT, catalogue, numerics

MIRROR_ENV = "SEQMIX_DATA_MIRROR"
CONFIG_DIR = REPO_ROOT / "config"  # the profiles a study's ``recordings`` name

ArchName = Literal[tuple(catalogue.mixer_names())]  # type: ignore[valid-type]
NumericsMode = Literal[numerics.MODES]  # type: ignore[valid-type]


class Section(BaseModel):
    """A config section: unknown keys are errors, values are immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# workflow_path's rules for editors checking a config against the JSON schema
WORKFLOW_PATH_PATTERN = {"pattern": r"^(?!~)(?=.*\S)[^{}<>\u0000]+$"}


def workflow_path(value: str) -> str:
    """A directory the Snakemake rules build paths in (results_dir, data.dir). Spaces,
    quotes and shell metacharacters are fine (every rule quotes its arguments); what
    cannot work is refused, with the reason."""
    if not value.strip():
        raise ValueError("is empty; give a directory (e.g. 'results'): an empty one would put files at the file system root")
    for chars, why in (("{}", "Snakemake reads {...} in a path as a wildcard"),
                       ("<>", "Snakemake reads <...> in a path as a path variable"),
                       ("\x00", "a path cannot hold a NUL character")):
        bad = sorted(set(value) & set(chars))
        if bad:
            raise ValueError(f"{value!r} contains {' and '.join(map(repr, bad))}: {why}; choose a path without it")
    if value.startswith("~"):
        raise ValueError(f"{value!r} starts with '~', which is not expanded here (it would make a directory named '~'); "
                         "write the full path")
    return value


# ------------------------------------------------------------------------------------------
# What one training run is made of: model, training schedule, data source, tokenizer.
# ------------------------------------------------------------------------------------------


class Budget(Section):
    """Match every architecture's parameter count to a budget by solving for width or depth."""

    params: int | None = Field(None, ge=1, description="target total parameters; null = use d_model/n_layers as given")
    solve: Literal["width", "depth"] = "width"
    width_step: int = Field(16, ge=1, description="d_model candidates are multiples of this")
    max_width: int = Field(1024, ge=1)
    max_depth: int = Field(48, ge=1)
    tolerance: float | None = Field(None, gt=0, description="relative tolerance on the count (0.01 = ±1 %): outside it d_ff is refined at the solved width, and a budget still missed is refused; null = the closest width, unchecked")
    ffn_step: int = Field(8, ge=1, description="d_ff candidates of that refinement are multiples of this")


def _per_architecture(v, key: str, what: str, choices: tuple[str, ...]):
    """A setting given for all architectures or per architecture ({<arch>: ..., default: ...}):
    every value one of ``choices``, every key ``default`` or a catalogued mixer."""
    bad = sorted({c for c in ([v] if isinstance(v, str) else v.values()) if c not in choices})
    if bad:
        raise ValueError(f"unknown {what} {', '.join(map(repr, bad))}; choose from: {', '.join(choices)}")
    return _architecture_keys(v, key)


def for_architecture(value, arch: str, fallback):
    """A per-architecture setting's value for ``arch``: ``value`` itself when it is given for
    all, else its ``arch`` entry, else its ``default``, else ``fallback``."""
    if not isinstance(value, dict):
        return value
    return value.get(arch, value.get("default", fallback))


def _architecture_keys(v, key: str):
    """``v`` where it is not a dict, or one whose every key is ``default`` or a catalogued mixer."""
    unknown = sorted(set(v) - {"default", *catalogue.mixer_names()}) if isinstance(v, dict) else []
    if unknown:
        raise ValueError(f"unknown architecture(s) {', '.join(unknown)} in {key}; keys are "
                         f"default or: {', '.join(catalogue.mixer_names())}")
    return v


POSITIONS = ("learned", "none")


class ModelSettings(Section):
    d_model: int = Field(256, ge=1)
    n_layers: int = Field(6, ge=1)
    d_ff_mult: float = Field(4.0, ge=0, description="feed-forward width as a multiple of d_model; 0 = no feed-forward (zoology MQAR)")
    dropout: float = Field(0.1, ge=0, le=1)
    block: str | dict[str, str] = Field(
        "native",
        description="the residual block (models/blocks.py): native = each architecture's own (catalogue.py), "
                    f"or one of {', '.join(catalogue.BLOCKS)} for all, or per architecture "
                    "{<arch>: <block>, default: <block>} (unlisted: default, else native)")
    tie_embeddings: bool = True
    positions: str | dict[str, str] = Field(
        "learned",
        description="position embeddings: learned (absolute, as the Grassmann paper's LM) or none, for all or per "
                    "architecture {<arch>: learned|none, default: ...}; Zoology's MQAR models give the "
                    "recurrences (GLA, H3, Mamba) none (Arora et al. 2024, App. C)")
    budget: Budget = Budget()

    @model_validator(mode="before")
    @classmethod
    def _norm_was_renamed(cls, data):
        if isinstance(data, dict) and "norm" in data:
            raise ValueError(f"model.norm is now model.block: write block: {data['norm']} (or block: native, "
                             "each architecture's own block)")
        return data

    @field_validator("block")
    @classmethod
    def _block_names_and_architectures(cls, v):
        return _per_architecture(v, "model.block", "block(s)", ("native", *catalogue.BLOCKS))

    @field_validator("positions")
    @classmethod
    def _position_schemes(cls, v):
        return _per_architecture(v, "model.positions", "position scheme(s)", POSITIONS)

    def positions_for(self, arch: str) -> str:
        """The position scheme ``arch`` trains with under this spec."""
        return for_architecture(self.positions, arch, "learned")

    def block_for(self, arch: str) -> str:
        """The block ``arch`` trains in under this spec: never "native"."""
        choice = for_architecture(self.block, arch, "native")
        return catalogue.mixer_entry(arch).block if choice == "native" else choice


class PlateauRule(Section):
    """Stop a run that has stopped improving: a run so stopped ends "plateau", not "budget"."""

    after: int = Field(..., ge=1, description="the earliest step at which a run may be stopped")
    window: int = Field(..., ge=1, description="the steps the recent periodic evaluations span")
    min_gain: float = Field(..., ge=0, description="stop when the best periodic evaluation of the last `window` steps beats the best before them by less than this (in the task metric's units)")


class TrainSettings(Section):
    steps: int = Field(1000, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1.0e-3, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = Field(100, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine decays to lr * min_lr_ratio")
    grad_clip: float = Field(1.0, ge=0, description="0 disables clipping")
    eval_every: int = Field(200, ge=1)
    eval_batches: int = Field(20, ge=1, description="batches of the eval split used for periodic evaluation")
    log_every: int = Field(10, ge=1)
    checkpoint_every: int = Field(200, ge=1)
    early_stop: float | None = Field(None, description="stop once a periodic evaluation's metric reaches this value (≥ when higher is better, else ≤; Zoology stops MQAR at 0.99 accuracy); null = every step")
    plateau: PlateauRule | None = Field(None, description="stop a run whose periodic evaluations stopped improving; null = never")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["fp32", "bf16"] = Field("fp32", description="bf16 autocast; use fp32 on CPU")
    threads: int | None = Field(None, ge=1, description="torch CPU threads per job; null = torch's default")
    reference_mixers: bool = Field(False, description="force the plain PyTorch mixers even where a Triton kernel exists")
    compile: bool = Field(False, description="a training step that is not launch-bound: torch.compile of the whole loss computation (CUDA graphs on a GPU) and fused AdamW; the first step runs eagerly. Losses equal eager ones up to float rounding (seqmix/train/step.py)")
    pack: bool | dict[str, bool] = Field(
        False,
        description="train the seeds of each architecture in one process as one vectorised model (a seed pack, "
                    "seqmix/train/pack.py: one launch-bound GPU step for all of them; slower on a CPU, "
                    "docs/investigations/seed-packs.md), for all architectures or per architecture {<arch>: true|false, default: ...}; "
                    "refused for mixers and tasks that cannot be vectorised. Written into a run's spec only when true, "
                    "so that an unpacked run's spec, config.json and identity are those it had before packs existed")

    @field_validator("pack")
    @classmethod
    def _pack_architectures(cls, v):
        return _architecture_keys(v, "train.pack")

    @model_serializer(mode="wrap")
    def _pack_only_when_set(self, handler):
        data = handler(self)
        if self.pack is False:  # an unpacked run's spec stays what it was before packs (field description)
            data.pop("pack", None)
        return data

    def pack_for(self, arch: str) -> bool:
        """Whether ``arch`` trains its seeds as one pack under these settings."""
        return bool(for_architecture(self.pack, arch, False))

    @field_validator("betas")
    @classmethod
    def _betas_in_unit_interval(cls, v):
        if not all(0 <= b <= 1 for b in v):
            raise ValueError("both betas must lie in [0, 1]")
        return v

    @model_validator(mode="after")
    def _plateau_sees_evaluations(self):
        # the rule compares evaluations inside the window with evaluations before it
        rule = self.plateau
        if rule is not None and rule.window < self.eval_every:
            raise ValueError(f"plateau.window ({rule.window}) is shorter than eval_every ({self.eval_every}): "
                             "no evaluation would fall in it; lengthen the window")
        if rule is not None and rule.after <= rule.window:
            raise ValueError(f"plateau.after ({rule.after}) must exceed plateau.window ({rule.window}): "
                             "the rule needs evaluations before the window")
        return self


class DataSettings(Section):
    dir: str = Field("data", description="where prepared data is written (no {, }, <, > or leading ~: Snakemake builds its paths from it)",
                     json_schema_extra=WORKFLOW_PATH_PATTERN)
    mirror: str | None = Field(None, description=f"local directory with the raw files (wikitext-2-raw/, snli/, SHA256SUMS: README, The data mirror); {MIRROR_ENV} is used when this is null")
    source: Literal["auto", "hub", "mirror"] = Field("auto", description="auto means the mirror when one is set, else the Hugging Face hub")

    _dir_works = field_validator("dir")(workflow_path)


class TokenizerSettings(Section):
    kind: Literal["auto", "pretrained", "trained"] = Field("auto", description="auto = bert-base-uncased from the hub when the data come from the hub, else WordPiece trained on the WikiText-2 training split")
    pretrained_name: str = "bert-base-uncased"
    vocab_size: int = Field(30522, ge=128)
    train_split: Literal["train", "validation", "test"] = "train"


class JobResources(Section):
    """What one job may use: Snakemake's ``mem_mb`` (the scheduler starts no more jobs than
    ``--resources mem_mb=`` allows together; `make` passes 90 % of this machine's memory) and
    ``runtime`` (minutes; a cluster executor's time limit)."""

    mem_mb: int = Field(ge=1)
    runtime: int = Field(ge=1, description="minutes")


def _jobs(mem_mb: int, runtime: int) -> JobResources:
    return JobResources(mem_mb=mem_mb, runtime=runtime)


class TaskResources(Section):
    """A task's own training and evaluation jobs (null: the study's ``resources``)."""

    train: JobResources | None = None
    eval: JobResources | None = None


class TaskSettings(Section):
    """Base of every task kind's own settings (``Task.Settings``)."""


class TaskCommon(Section):
    """What every task section has besides its kind's settings."""

    model: ModelSettings = ModelSettings()
    train: TrainSettings = TrainSettings()
    seeds: list[int] | dict[str, list[int]] | None = Field(
        None, description="this task's seeds; null = the study's; or per architecture {<arch>: [0, 1, 2], "
                          "default: [0]} (unlisted: default, else the study's)")
    architectures: list[ArchName] | None = Field(None, description="this task's architectures; null = the study's")  # type: ignore[valid-type]
    resources: TaskResources = TaskResources()
    mixers: dict[ArchName, dict[str, Any]] = Field(  # type: ignore[valid-type]
        default_factory=dict,
        description="this task's mixer options over the study's mixers.<arch>, e.g. {h3: {d_state: 64}} (Zoology's H3 d_state = L)")
    sweep: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="grid of model./train. settings, e.g. {model.d_model: [32, 64], train.lr: [1e-3, 3e-3]}: one task per point, named <task>/<point>",
    )

    @field_validator("seeds")
    @classmethod
    def _seed_lists(cls, v):
        if v is None:
            return v
        for seeds in v.values() if isinstance(v, dict) else [v]:
            if not seeds or len(set(seeds)) != len(seeds) or any(s < 0 for s in seeds):
                raise ValueError(f"seeds must be a non-empty list of distinct seeds >= 0, got {seeds}")
        return _architecture_keys(v, "seeds")

    def seeds_for(self, arch: str, study_seeds: list[int]) -> list[int]:
        """The seeds ``arch`` trains with on this task (``study_seeds``: the study's)."""
        return list(for_architecture(self.seeds, arch, study_seeds) or study_seeds)


# ------------------------------------------------------------------------------------------
# Analyses and report.
# ------------------------------------------------------------------------------------------


class ComplexitySettings(Section):
    """Cost vs sequence length (analysis/complexity.py): counts at every length, wall time
    until a mixer's fastest forward+backward takes max_seconds."""

    lengths: list[int] = Field([64, 128, 256, 512, 1024], min_length=2, description="every length is counted; the shorter ones are also timed")
    d_model: int = Field(64, ge=1)
    batch_size: int = Field(1, ge=1)
    repeats: int = Field(5, ge=1, description="timed calls per length; the fit takes their minimum")
    warmup: int = Field(1, ge=0)
    max_seconds: float = Field(5.0, gt=0, description="stop timing a mixer (its counts go on) once its fastest forward+backward takes longer than this")
    count_tensors: Literal["auto", "fake", "real"] = Field(
        "auto", description="count FLOPs, bytes and peak memory under FakeTensorMode (no arithmetic, but slow Python per op; a mixer that needs real values falls back to real) or on real CPU tensors; auto = fake until a mixer's number of ops grows x1.5 per doubling of L (a Python loop over chunks), real from there on")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    architectures: Literal["all"] | list[ArchName] | None = Field(  # type: ignore[valid-type]
        None, description="mixers to measure: null = the study's architectures, all = every catalogued mixer, or a list")
    fit_longest: int = Field(3, ge=3, description="fit each log-log exponent over this many of the longest lengths at which it was measured")


class SparsitySettings(Section):
    tasks: list[str] | None = Field(None, description="tasks whose runs are measured (a swept task: all its points, or name one point); null = the study's first language-model task")
    fallback_task: str | None = Field("auto", description="architectures with no run on tasks (non-causal-only mixers) are measured on their runs of this task; auto = the first task that has them; null = left out")
    crop_len: int = Field(32, ge=2, description="held-out inputs of encoder (non-causal) tasks with at least this many tokens, cropped to it (no padding in the rows)")
    split: Literal["validation", "test"] = "validation"
    num_sequences: int = Field(8, ge=1)
    seed: int = Field(0, ge=0)
    min_row_len: int = Field(16, ge=1, description="keep only rows with at least this many visible keys (short causal rows are trivially concentrated)")
    jacobian_sequences: int = Field(2, ge=0, description="sequences (of num_sequences) for the Jacobian effective attention; L·d backward rows each; 0 = skip")
    jacobian_chunk: int = Field(512, ge=1, description="Jacobian rows per batched backward pass (memory vs speed)")
    jacobian_positions: int | None = Field(None, ge=1, description="query positions per sequence whose Jacobian rows are computed, spread evenly; null = every kept position")


class SparsityAnalyticSettings(Section):
    """Grids of the closed-form curves (analysis/su.py)."""

    beta_range: tuple[float, float] = Field((-3.0, 3.0), description="β = q·μ grid ends")
    beta_points: int = Field(25, ge=1)
    gamma_range: tuple[float, float] = Field((0.05, 3.0), description="γ = σ‖q‖ grid ends (query norm × key spread)")
    gamma_points: int = Field(60, ge=1)
    lengths: list[int] = Field([4, 16, 64, 256, 1024, 4096, 16384, 65536], min_length=1, description="n for the decay form")
    lambdas: list[float] = Field([0.5, 0.9, 0.99, 0.999, 1.0], min_length=1)
    feature_dim: int = Field(16, ge=1, description="d of the elu+1 feature map")
    mc_points: list[tuple[float, float]] = Field([(0.0, 0.5), (0.0, 1.0), (-1.0, 0.7)], description="(β, γ) points of the finite-n Monte Carlo curves")
    mc_lengths: list[int] = Field([4, 16, 64, 256, 1024, 4096], min_length=1)
    mc_rows: int = Field(200, ge=2, description="sampled rows per Monte Carlo point")
    seed: int = Field(0, ge=0)


class GeometrySettings(Section):
    """Grassmann Plücker/plane geometry and TSSA compression term of trained runs."""

    task: str | None = Field(None, description="task whose runs are measured; null = the study's first language-model task")
    split: Literal["validation", "test"] = "validation"
    num_sequences: int = Field(8, ge=1)
    max_quadruples: int | None = Field(2000, ge=1, description="Plücker relations checked per vector (i<j<k<l sampled); null = all C(r,4)")
    tssa_eps: float = Field(0.5, gt=0, description="coding precision ε of the compression term")
    seed: int = Field(0, ge=0)


class CopyProbeSettings(Section):
    """Can each mixer copy the previous token? A fresh causal LM per architecture, built as
    an MQAR task builds its models, trained to predict token t-1 at position t of uniform
    random tokens (analysis/copy_probe.py)."""

    task: str | None = Field("auto", description="the MQAR task whose model (n_layers, d_ff_mult, dropout, block, positions, tie_embeddings) and mixer options the probe's models take (a swept task: its first point); auto = the study's first MQAR task; null = no probe")
    d_model: int = Field(64, ge=1, description="width of every probe model (the task's own is not used)")
    seq_len: int = Field(48, ge=2)
    vocab_size: int = Field(256, ge=2, description="tokens are uniform over it: chance accuracy is 1 / vocab_size")
    steps: int = Field(300, ge=1)
    batch_size: int = Field(128, ge=1)
    lr: float = Field(3.0e-3, gt=0, description="peak AdamW learning rate (weight decay, betas and the cosine floor are the task's)")
    warmup_steps: int = Field(30, ge=0)
    eval_sequences: int = Field(1024, ge=1, description="held-out sequences (drawn from their own seed) scored after training")
    seed: int = Field(0, ge=0)
    architectures: list[ArchName] | None = Field(  # type: ignore[valid-type]
        None, description="mixers to probe (causal ones); null = the study's architectures that have a causal form")
    lags: list[int] = Field(
        [1], min_length=1, description="copy the token this many positions back (1: the previous token), one probe "
                                       "per lag and mixer, a lag other than 1 only for mixers whose reach is finite: "
                                       "beyond a mixer's reach (e.g. Grassmann's n_layers x its largest offset) it "
                                       "tests that reach (claim grassmann-recall-reach)")

    @field_validator("lags")
    @classmethod
    def _lags_fit(cls, v):
        if len(set(v)) != len(v) or any(lag < 1 for lag in v):
            raise ValueError(f"lags must be distinct and >= 1, got {v}")
        return v

    @model_validator(mode="after")
    def _lags_within_length(self):
        if max(self.lags) >= self.seq_len:
            raise ValueError(f"lags {self.lags} must be below seq_len {self.seq_len}: a lag of seq_len leaves no "
                             "position to score")
        return self

    @model_serializer(mode="wrap")
    def _lags_when_set(self, handler):
        # The previous token alone (the default) is the probe as it was before lags existed:
        # left out, so that a study that sets no lags keeps its specs and their digests.
        data = handler(self)
        if list(self.lags) == [1]:
            data.pop("lags", None)
        return data


class ThroughputSettings(Section):
    """Training tokens/s of every causal mixer's LM beside softmax (seqmix/analysis/throughput.py)."""

    lengths: list[int] = Field([64, 1024], min_length=1, description="sequence lengths L")
    d_model: int = Field(64, ge=1)
    n_layers: int = Field(2, ge=1)
    d_ff_mult: float = Field(4.0, ge=0, description="feed-forward width as a multiple of d_model; 0 = none")
    vocab_size: int = Field(4096, ge=2)
    block: Literal[("native", *catalogue.BLOCKS)] = Field(
        "native", description="the residual block of every model: native = each architecture's own (catalogue.py)")
    dropout: float = Field(0.1, ge=0, le=1)
    tokens_per_batch: int = Field(4096, ge=1, description="tokens per training step; batch = tokens_per_batch // L (at least 1)")
    warmup: int = Field(1, ge=0, description="untimed training steps per model before the first round")
    steps: int = Field(1, ge=1, description="training steps timed per (architecture, L) in every round")
    repeats: int = Field(5, ge=1, description="interleaved rounds; the table reports medians over them")
    threads: int = Field(1, ge=1, description="torch CPU threads: 1 = numbers per core")
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    architectures: Literal["all"] | list[ArchName] | None = Field(  # type: ignore[valid-type]
        None, description="mixers to time (their causal ones; softmax is always added): null = the study's architectures, all = every catalogued mixer")


class AnalysisSettings(Section):
    complexity: ComplexitySettings = ComplexitySettings()
    sparsity: SparsitySettings = SparsitySettings()
    sparsity_analytic: SparsityAnalyticSettings = SparsityAnalyticSettings()
    geometry: GeometrySettings = GeometrySettings()
    copy_probe: CopyProbeSettings = CopyProbeSettings()
    throughput: ThroughputSettings = ThroughputSettings()


class ReportSettings(Section):
    title: str = "Is softmax attention what sequence models need?"
    scope: str = Field("", description="plain text the report's Setup section prints about this profile: what it measures, what it leaves out and why")


class ResourcesSettings(Section):
    """Per rule; defaults sized for the quick profile's CPU jobs (peak RSS measured there
    stays under half of each), ``python -m seqmix plan`` estimates a profile's, and every
    job's measured time and peak memory land in <results_dir>/benchmarks/."""

    train: JobResources = _jobs(2000, 60)
    eval: JobResources = _jobs(2000, 30)
    data: JobResources = _jobs(3000, 30)
    complexity: JobResources = _jobs(4000, 60)
    throughput: JobResources = _jobs(3000, 30)
    sparsity_run: JobResources = _jobs(3000, 60)
    geometry: JobResources = _jobs(2000, 30)
    copy_probe: JobResources = _jobs(2000, 30)
    notebook: JobResources = _jobs(2000, 15)
    report: JobResources = _jobs(1000, 15)
    small: JobResources = Field(_jobs(1000, 10), description="collect, concat, sparsity_analytic")


def without_empty_recordings(self, handler):
    """A model's dump without ``recordings`` where it is empty: a study without recordings
    (and its jobs) dumps as it did before the key existed. (A method of the models that use it.)"""
    out = handler(self)
    if isinstance(out, dict) and not out.get("recordings", True):
        del out["recordings"]
    return out


class StudyFile(Section):
    """The shape of a config file; task sections and mixer options are checked per entry
    (their models depend on the entry's kind or mixer)."""

    profile: str = Field("quick", description="name of this study, written into every result")
    numerics: NumericsMode = Field(  # type: ignore[valid-type]
        numerics.DEFAULT,
        description="portable (the default): every job pins ATen, oneDNN and oneMKL to one code path every x86-64 "
                    "CPU with AVX2 and FMA has, on one thread, and loads a small library built with the machine's C "
                    "compiler once (seqmix/mkl_shim.py), so that any such host gives the same bits; native: each "
                    "library takes the host's fastest path, and results depend on the CPU (seqmix/numerics.py)")
    results_dir: str = Field("results", description="where runs, analyses and logs are written (no {, }, <, > or leading ~: Snakemake builds its paths from it)",
                             json_schema_extra=WORKFLOW_PATH_PATTERN)
    data: DataSettings = DataSettings()
    tokenizer: TokenizerSettings = TokenizerSettings()
    architectures: list[ArchName] = Field(min_length=1)  # type: ignore[valid-type]
    seeds: list[int] = Field(min_length=1)
    tasks: dict[str, dict[str, Any]] = Field(min_length=1, description="task name (<kind> or <kind>/<variant>) -> its section")
    mixers: dict[ArchName, dict[str, Any]] = Field(default_factory=dict, description="per-architecture options, e.g. {grassmann: {rank: 32}}")  # type: ignore[valid-type]
    analysis: AnalysisSettings = AnalysisSettings()
    report: ReportSettings = ReportSettings()
    resources: ResourcesSettings = ResourcesSettings()
    recordings: list[str] = Field(default_factory=list, description="recorded studies this study's report reads as "
                                  "if it had trained them: the newest recording of each profile under "
                                  "results/recorded/<profile>/ whose runs are what config/<profile>.yaml resolves "
                                  "to at this checkout (python -m seqmix record makes one)")

    _results_dir_works = field_validator("results_dir")(workflow_path)

    @field_validator("recordings")
    @classmethod
    def _recorded_profiles(cls, v):
        missing = [p for p in v if not (CONFIG_DIR / f"{p}.yaml").is_file()]
        if missing:
            raise ValueError(f"names {', '.join(missing)}, with no config/{missing[0]}.yaml in this checkout: "
                             "name a profile of config/ (its recording is checked against that file)")
        if len(set(v)) != len(v):
            raise ValueError("entries must be unique")
        return v

    _without_empty_recordings = model_serializer(mode="wrap")(without_empty_recordings)

    @field_validator("architectures", "seeds")
    @classmethod
    def _unique(cls, v):
        if len(set(v)) != len(v):
            raise ValueError("entries must be unique")
        return v

    @field_validator("seeds")
    @classmethod
    def _non_negative(cls, v):
        if any(s < 0 for s in v):
            raise ValueError("seeds must be >= 0")
        return v


class Study(StudyFile):
    """A validated study: task sections typed by kind, mixer options complete (defaults
    filled from each mixer's Options)."""

    tasks: dict[str, SerializeAsAny[TaskCommon]]  # type: ignore[assignment]
    mixers: dict[ArchName, dict[str, Any]] = Field(default_factory=dict)  # type: ignore[valid-type]


