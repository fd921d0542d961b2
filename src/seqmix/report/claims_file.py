"""``paper/claims.yaml`` as typed data: one frozen pydantic model per claim kind, the file a
list of them told apart by ``kind``, validated when it is read (``load_claims``). Every key a
kind takes, its type and its default are stated here once; a bad entry is refused with one
line naming the claim and the key, as a bad config is (seqmix.errors.problem_lines).

Reading the file imports no torch and no pandas: the Snakefile checks it when it parses, so
that a malformed claim stops the run before any job. The verdicts are seqmix.report.claims's.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from seqmix.errors import ConfigError, problem_lines
from seqmix.io import yaml_data


class ClaimsError(ConfigError):
    """A malformed claims file; each line names the file, the claim and the key."""


class Part(BaseModel):
    """A part of a claim: unknown keys are errors, values are immutable once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AgreeIf(Part):
    """What counts as agreement: the measured value's bounds, inclusive."""

    min: float | None = None
    max: float | None = None

    def holds(self, value: float) -> bool:
        """``value`` within the bounds (a NaN meets no bound)."""
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    @property
    def floor(self) -> float:
        return -math.inf if self.min is None else self.min

    @property
    def ceiling(self) -> float:
        return math.inf if self.max is None else self.max


# --- what scale a run must reach before a verdict means anything (``requires``) ---------------


class NoRequirements(Part):
    """A kind whose verdict needs no scale (a closed form), or states its own (width_to_reach)."""


class RunRequirements(Part):
    """The scale of the runs a paired or threshold claim reads."""

    backbone: str | None = Field(None, description="a backbone seqmix does not train: the claim is not testable here, for this reason")
    min_params: int | None = Field(None, ge=1, description="the fewest parameters of any run")
    min_steps: int | None = Field(None, ge=1, description="the fewest training steps of any run")
    complete_train_data: bool = Field(False, description="every run trained on the whole training split")


class ThresholdRequirements(RunRequirements):
    """A threshold at every point of a sweep (``per``): each seed of the selected run must have
    settled, and left the task's initial plateau."""

    max_final_gain: float | None = Field(None, description="largest gain of the periodic evaluation metric over the last quarter of the steps")
    min_over_chance: float | None = Field(None, gt=0, description="the test metric must reach this multiple of chance")


class LengthRequirements(Part):
    min_length: int = Field(0, ge=0, description="the longest length measured must reach this")


class SparsityRequirements(Part):
    max_reference_sparsity: float | None = Field(None, description="the reference's mean S must be at most this (below: rows near-uniform)")


class RecallRequirements(Part):
    min_accuracy_within_reach: float | None = Field(None, description="accuracy on the queries within reach must reach this")


# --- the kinds ---------------------------------------------------------------------------------


class Claim(Part):
    """What every claim has: its id, the claim and its source, what the source reports, the
    unit and criterion of our value, and which runs decide it."""

    id: str = Field(min_length=1)
    claim: str
    source: str = Field(min_length=1)
    reported: str
    unit: str
    agree_if: AgreeIf
    runs: Literal["profile", "recorded"] = Field(
        "profile", description="profile: the runs of the study being reported; recorded: the newest recorded "
                               "headline study's (results/recorded/), else the profile's")


class OnTask(Claim):
    """A claim measured on a task's runs. A list names where each profile tests it: the first
    task (or sweep) this profile trained is judged (seqmix.report.claims.task_in_profile)."""

    task: str | list[str]


Split = Literal["eval", "test"]  # eval: the periodic-evaluation split (validation)


class Paired(OnTask):
    arch: str
    baseline: str
    split: Split = "test"
    requires: RunRequirements


class RelativeGap(Paired):
    """100·(metric[arch] / metric[baseline] − 1) per paired seed, mean ± 95% CI."""

    kind: Literal["relative_gap"]


class AccuracyDifference(Paired):
    """metric[arch] − metric[baseline] per paired seed, mean ± 95% CI."""

    kind: Literal["accuracy_difference"]


class MetricThreshold(OnTask):
    """metric[arch], mean ± 95% CI; with ``per``, at every value of that swept axis, and with
    ``each_seed`` on every seed."""

    kind: Literal["metric_threshold"]
    arch: str
    split: Split = "test"
    per: str | None = Field(None, description="a swept axis, e.g. model.d_model")
    each_seed: bool = False
    requires: ThresholdRequirements


class ComplexityExponent(Claim):
    """The fitted log-log exponent of cost measures (complexity_fit.csv)."""

    kind: Literal["complexity_exponent"]
    arch: str | list[str]
    measures: list[str] = Field(min_length=1)
    requires: LengthRequirements


class SuClosedForm(Claim):
    """Su's closed form over the analytic grid, checked against Monte Carlo."""

    kind: Literal["su_closed_form"]
    kernel: str
    statistic: Literal["min", "at_beta_zero"]
    requires: NoRequirements


class MeasuredSparsity(OnTask):
    """Su's S of trained attention rows, arch minus baseline per seed."""

    kind: Literal["measured_sparsity"]
    arch: str
    baseline: str
    positions: str | None = Field(None, description="the rows measured (sparsity.csv's positions); null: every row")
    requires: SparsityRequirements


class WidthToReach(OnTask):
    """log2 of the width arch needs over the largest a baseline needs to reach ``threshold``."""

    kind: Literal["width_to_reach"]
    per: str
    arch: str
    baselines: list[str] = Field(min_length=1)
    threshold: float
    reached_by: Literal["majority", "every"] = "majority"
    learned_below: float | None = Field(None, gt=0, description="a mixer whose final validation loss stays above this "
                                                                "fraction of the informed-chance level did not learn")
    requires: NoRequirements


class RecallBeyondReach(OnTask):
    """Accuracy minus chance on the queries beyond a model's reach (the test split)."""

    kind: Literal["recall_beyond_reach"]
    arch: str
    split: Literal["test"] = "test"
    requires: RecallRequirements


class CopyBeyondReach(Claim):
    """Accuracy minus chance of the copy probe (analysis/copy_probe.csv) at the lags beyond a
    model's reach, where it learns to copy within it."""

    kind: Literal["copy_beyond_reach"]
    arch: str
    requires: RecallRequirements


class TrendRequirements(Part):
    min_sizes: int = Field(3, ge=3, description="sizes (tasks) with at least two paired seeds each")
    min_span: float = Field(4.0, ge=1.0, description="the largest size's parameters over the smallest's")


class Reference(Part):
    """A published measurement drawn beside ours: a pair of perplexities and where they are from."""

    label: str = Field(min_length=1)
    source: str = Field(min_length=1, description="author, year and where (a URL)")
    url: str = Field(min_length=1)
    params: float = Field(gt=0, description="the baseline's parameter count")
    split: Literal["validation", "test"]
    arch_value: float = Field(gt=0, description="arch's perplexity")
    baseline_value: float = Field(gt=0, description="the baseline's perplexity")

    @property
    def gap(self) -> float:
        """100·(arch / baseline − 1), as relative_gap computes ours."""
        return 100.0 * (self.arch_value / self.baseline_value - 1.0)


class Band(Part):
    """A claim's stated range drawn on the trend figure: the gap it states over the sizes it states."""

    claim: str = Field(min_length=1, description="the id of the claim that states it")
    gap: tuple[float, float]
    params: tuple[float, float]


class GapTrend(Claim):
    """The slope of relative_gap's per-seed value against log10(parameters) over the sizes of
    a ladder (the tasks matching ``tasks``): mean slope and its 95% interval."""

    kind: Literal["gap_trend"]
    tasks: str = Field(min_length=1, description="a pattern (fnmatch) of the ladder's task names, e.g. wikitext2/ladder-*")
    arch: str
    baseline: str
    split: Split = "eval"
    band: Band | None = None
    references: list[Reference] = Field(default_factory=list)
    requires: TrendRequirements = TrendRequirements()


AnyClaim = Annotated[RelativeGap | AccuracyDifference | MetricThreshold | ComplexityExponent | SuClosedForm
                     | MeasuredSparsity | WidthToReach | RecallBeyondReach | CopyBeyondReach | GapTrend,
                     Field(discriminator="kind")]
# The kinds by name, in the order above: a claims.yaml ``kind`` names one.
MODELS: dict[str, type[Claim]] = {get_args(m.model_fields["kind"].annotation)[0]: m for m in get_args(get_args(AnyClaim)[0])}
KINDS: tuple[str, ...] = tuple(MODELS)


class ClaimsFile(Part):
    claims: list[AnyClaim]

    @model_validator(mode="after")
    def _ids_differ(self):
        ids = [c.id for c in self.claims]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"claim id(s) {', '.join(map(repr, twice))} appear more than once")
        return self


def load_claims(path: str | os.PathLike) -> list[AnyClaim]:
    """The claims of ``path``, validated; ClaimsError naming each bad claim and key."""
    try:
        raw = yaml_data(Path(path).read_text())
    except OSError as e:
        raise ClaimsError(f"{path}: cannot be read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ClaimsError(f"{path} is not valid YAML: {e}") from None
    try:
        return list(ClaimsFile.model_validate(raw).claims)
    except ValidationError as e:
        raise ClaimsError("\n".join(f"{path}: {line}" for line in _claim_problems(raw, e))) from None


def _claim_problems(raw, error: ValidationError) -> list[str]:
    """One line per problem, led by the claim it is in (by id, else by position)."""
    entries = raw.get("claims") if isinstance(raw, dict) else None
    by_claim: dict[tuple, list[dict]] = {}
    for e in error.errors():
        loc = tuple(e["loc"])
        if len(loc) >= 2 and loc[0] == "claims" and isinstance(loc[1], int):
            # claims.<i>.<kind>.<key>: the kind pydantic tried is not part of the key
            at = loc[3:] if len(loc) > 2 and loc[2] in KINDS else loc[2:]
            if e["type"].startswith("union_tag_"):  # no kind, or one that is not a claim kind
                at = ("kind",)
            by_claim.setdefault(loc[:2], []).append({**e, "loc": at})
        else:
            by_claim.setdefault((), []).append(e)
    lines = []
    for where, errors in by_claim.items():
        allowed = _allowed(entries[where[1]]) if where else {(): list(ClaimsFile.model_fields)}
        named = f"claim {_name(entries, where[1])}: " if where else ""
        lines += [named + line for line in problem_lines(errors, allowed, what="key")]
    return lines


def _name(entries: list, index: int) -> str:
    entry = entries[index]
    cid = entry.get("id") if isinstance(entry, dict) else None
    return repr(cid) if isinstance(cid, str) and cid else f"#{index + 1} (no id)"


def _allowed(entry) -> dict[tuple, list[str]]:
    """The keys a claim of the entry's kind takes, at its top and under ``requires``."""
    model = MODELS.get(entry.get("kind") if isinstance(entry, dict) else None)
    if model is None:
        return {}
    return {(): list(model.model_fields), ("requires",): list(model.model_fields["requires"].annotation.model_fields),
            ("agree_if",): list(AgreeIf.model_fields)}
