"""The config is validated before any work: defaults filled, every bad key named."""

from __future__ import annotations

import re

import pytest
import yaml

from seqmix import REPO_ROOT
from seqmix.expansion.table import expand
from seqmix.expansion.validate import ConfigError, load_study, validate_study

MINIMAL = {"tasks": {"mqar": {}}, "architectures": ["softmax"], "seeds": [0]}


def test_defaults_are_filled_from_the_schema():
    cfg = validate_study(MINIMAL)
    assert cfg.results_dir == "results"
    assert cfg.tasks["mqar"].train.lr == 1e-3
    assert cfg.tasks["mqar"].model.budget.solve == "width"
    assert cfg.tasks["mqar"].seq_len == 64  # the task kind's own default
    assert cfg.analysis.complexity.repeats >= 1
    assert "wikitext2" not in cfg.tasks  # tasks are not invented


@pytest.mark.parametrize("path", ["config/config.yaml", "config/paper.yaml"])
def test_shipped_configs_are_valid(path):
    cfg = load_study(REPO_ROOT / path)
    assert expand(cfg).runs


def test_unknown_key_is_named_with_the_allowed_ones():
    bad = {**MINIMAL, "tasks": {"mqar": {"train": {"stpes": 10}}}}
    with pytest.raises(ConfigError, match=r"unknown key\(s\) 'stpes' under 'tasks.mqar.train'; allowed: .*steps"):
        validate_study(bad)


def test_wrong_type_names_the_key():
    bad = {**MINIMAL, "tasks": {"mqar": {"train": {"lr": "fast"}}}}
    with pytest.raises(ConfigError, match=r"tasks.mqar.train.lr"):
        validate_study(bad)


def test_unknown_architecture_lists_the_allowed_values():
    with pytest.raises(ConfigError, match=r"architectures\[1\]'.*'transformer'.*allowed values: softmax, grassmann"):
        validate_study({**MINIMAL, "architectures": ["softmax", "transformer"]})


def test_unknown_mixer_option_fails_before_any_job():
    with pytest.raises(ConfigError, match=r"'rnk' under 'mixers.grassmann'; allowed: .*rank"):
        validate_study({**MINIMAL, "mixers": {"grassmann": {"rnk": 4}}})


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as e:
        validate_study({"tasks": {"mqar": {"seq_len": -1}}, "architectures": ["x"], "seeds": [0], "oops": 1})
    msg = str(e.value)
    assert "oops" in msg and "architectures[0]" in msg and "tasks.mqar.seq_len" in msg


def test_training_on_the_evaluation_split_is_refused():
    with pytest.raises(ConfigError, match="tasks.wikitext2.*eval_split"):
        validate_study({**MINIMAL, "tasks": {"wikitext2": {"train_split": "validation"}}})


def test_runs_cover_task_arch_seed_and_skip_noncausal_lm():
    cfg = validate_study({"tasks": {"mqar": {}, "snli": {}}, "architectures": ["softmax", "linformer"], "seeds": [0, 1]})
    got = expand(cfg).runs
    assert ("snli", "linformer", 1) in got
    assert not any(t == "mqar" and a == "linformer" for t, a, _ in got)
    assert len(got) == 2 * 2 + 1 * 2


def test_a_task_gives_seeds_per_architecture_and_refuses_bad_ones():
    # Three seeds where a task names them for an architecture, its default elsewhere; the
    # study's seeds where it has no default.
    cfg = validate_study({"tasks": {"mqar": {"seeds": {"default": [0], "softmax": [0, 1, 2]}},
                                     "mqar/b": {"seeds": {"grassmann": [4]}}},
                           "architectures": ["softmax", "grassmann"], "seeds": [7]})
    assert list(expand(cfg).runs) == [("mqar", "softmax", 0), ("mqar", "softmax", 1), ("mqar", "softmax", 2), ("mqar", "grassmann", 0),
                         ("mqar/b", "softmax", 7), ("mqar/b", "grassmann", 4)]
    for seeds, message in (({"softmx": [0]}, "unknown architecture(s) softmx in seeds"),
                           ({"softmax": [1, 1]}, "distinct seeds >= 0, got [1, 1]"), ([], "non-empty list")):
        with pytest.raises(ConfigError, match=rf"tasks.mqar.seeds.*{re.escape(message)}"):
            validate_study({**MINIMAL, "tasks": {"mqar": {"seeds": seeds}}})


def test_run_spec_holds_only_its_task():
    cfg = validate_study({"tasks": {"mqar": {}, "snli": {}}, "architectures": ["softmax"], "seeds": [3]})
    spec = expand(cfg).run_spec("mqar", "softmax", 3)
    assert spec.run_dir.endswith("runs/mqar/softmax/seed3")
    assert "train_file" not in spec.settings and spec.settings["seq_len"] == 64  # snli's settings are not part of it


def test_yaml_file_errors_name_the_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump({**MINIMAL, "seeds": "zero"}))
    with pytest.raises(ConfigError, match=r"(?s)bad.yaml.*seeds"):
        load_study(p)


def test_config_yaml_builds_no_python_objects(tmp_path):
    # Configs are read with libyaml's safe loader where PyYAML has it (seqmix.io.yaml_data):
    # a tag that would call Python is a parse error naming the file, not a call.
    p = tmp_path / "tagged.yaml"
    p.write_text("seeds: !!python/object/apply:os.getpid []\n")
    with pytest.raises(ConfigError, match=r"tagged.yaml is not valid YAML"):
        load_study(p)


def test_the_committed_json_schema_is_current():
    # workflow/schemas/config.schema.json documents the config (editors can complete and check
    # a config file against it); it is generated from the config models, never edited. What
    # it says of mixers may lag the catalogue without being wrong (a mixer catalogued since it
    # was written is only not completed; config_schema's docstring): that part must be true
    # of every mixer it names, and everything else must be current.
    import copy
    import json

    from seqmix.expansion.validate import SCHEMA_PATH, config_schema

    committed, current = json.loads(SCHEMA_PATH.read_text()), json.loads(json.dumps(config_schema()))

    def mixer_parts(schema: dict) -> tuple[dict, list[str], dict]:
        rest = copy.deepcopy(schema)
        return rest, rest["$defs"]["ArchName"].pop("examples"), rest["properties"]["mixers"].pop("properties")

    fix = "regenerate it: python -m seqmix schema --out workflow/schemas/config.schema.json"
    rest, names, options = mixer_parts(committed)
    rest_now, names_now, options_now = mixer_parts(current)
    assert rest == rest_now, fix
    assert set(names) <= set(names_now) and set(options) <= set(names_now), f"it names a mixer no longer catalogued; {fix}"
    assert {arch: options_now[arch] for arch in options} == options, f"a mixer's options changed; {fix}"


def test_the_json_schema_rejects_what_validation_rejects():
    import jsonschema

    from seqmix.expansion.validate import config_schema

    schema = config_schema()
    good = yaml.safe_load((REPO_ROOT / "config" / "config.yaml").read_text())
    jsonschema.validate(good, schema)
    for bad in ({**good, "sedes": [0]}, {**good, "tasks": {"mqar/": {}}},
                {**good, "mixers": {"grassmann": {"rnk": 4}}}, {**good, "tasks": {"wikitext3": {}}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
        with pytest.raises(ConfigError):
            validate_study(bad)
