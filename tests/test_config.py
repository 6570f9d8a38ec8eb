"""Every config file composes into the typed schema and passes the checks the loop relies on."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from coevo.config.schema import GROUPS, TrainConfig, describe, register
from coevo.loop.build import to_config
from coevo.loop.config_check import check

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
EXTRA = {"meta_agent/openai": ["meta_agent.model=some-model"]}  # its one required value


LAUNCHER_CONFIGS = {"accelerate"}  # configs/accelerate/: accelerate launch --config_file files, not Hydra groups


def options() -> list[tuple[str, str]]:
    return sorted((d.name, f.stem) for d in CONFIGS.iterdir() if d.is_dir() and d.name not in LAUNCHER_CONFIGS
                  for f in d.glob("*.yaml"))


def compose_cfg(overrides: list[str]) -> TrainConfig:
    register()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=["run_dir=/tmp/coevo-test-run", *overrides])
    return to_config(cfg)


def test_every_group_has_a_schema_and_a_yaml_per_option():
    assert {g for g, _ in options()} == set(GROUPS) | {"experiment"}


@pytest.mark.parametrize(("group", "option"), options())
def test_each_config_file_composes_and_checks(group, option):
    cfg = compose_cfg([f"{group}={option}", *EXTRA.get(f"{group}/{option}", [])])
    assert isinstance(cfg, TrainConfig)
    check(cfg)
    if group != "experiment":  # the file's own values reached the typed config
        path = CONFIGS / group / f"{option}.yaml"
        own = OmegaConf.load(path)
        is_global = "@package _global_" in path.read_text().split("\n", 3)[0]  # e.g. rollout=vllm sets buffer.*
        sections = [(getattr(cfg, key), own[key]) for key in own] if is_global else [(getattr(cfg, group), own)]
        for section, values in sections:
            for key in values:
                if key == "defaults" or OmegaConf.is_missing(values, key):
                    continue
                value = values[key]
                assert getattr(section, key) == (OmegaConf.to_container(value) if OmegaConf.is_config(value)
                                                 else value)


def test_defaults_are_the_main_job():
    cfg = compose_cfg([])
    assert (cfg.mode, cfg.model.name, cfg.model.lora, cfg.meta_agent.backend, cfg.env.name) == (
        "coevolve", "smollm2", True, "rule", "reasoning")


def test_smoke_experiment_overrides_groups_and_values():
    cfg = compose_cfg(["experiment=smoke"])
    assert (cfg.model.name, cfg.env.name, cfg.name, cfg.rounds) == ("tiny", "arithmetic", "smoke", 2)


def test_a_wrong_type_or_unknown_key_is_refused():
    with pytest.raises(Exception, match="rounds"):
        compose_cfg(["rounds=many"])
    with pytest.raises(Exception, match="no_such_key"):
        compose_cfg(["trainer.no_such_key=1"])


@pytest.mark.parametrize(("override", "field"), [
    ("mode=both", "mode"), ("rollout.backend=tgi", "rollout.backend"), ("evolution.gate=vote", "evolution.gate"),
    ("trainer.aggregation=sum", "trainer.aggregation"), ("logger.kind=mlflow", "logger.kind"),
    ("trainer.kl_estimator=k4", "trainer.kl_estimator"),
    ("batch_tasks=0", "batch_tasks"), ("buffer.capacity=4", "buffer.capacity"),
])
def test_check_names_the_field_and_the_allowed_values(override, field):
    cfg = compose_cfg([override])
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        check(cfg)


def test_an_aggregation_outside_the_objectives_table_names_the_table():
    with pytest.raises(ValueError, match=r"^config trainer\.aggregation='dapo' is not allowed; choose one of "
                                         r"\['token_mean', 'sequence_mean', 'dr_grpo'\]$"):
        check(compose_cfg(["trainer.aggregation=dapo"]))


def test_the_schema_default_gate_is_the_main_jobs_and_the_critics_table_is_the_choices():
    from coevo.config.schema import EvolutionConfig
    from coevo.evolution.critic import GATES

    assert compose_cfg([]).evolution.gate == EvolutionConfig.gate == "stat"
    assert set(GATES) == {"stat", "seesaw", "performance", "both"}
    for gate in GATES:
        check(compose_cfg([f"evolution.gate={gate}"]))


def test_every_rule_is_checked_generically_once_per_field():
    """A field's allowed values live in its metadata (``opt``); ``violations`` checks every field,
    naming the field, the value and what is allowed, and ``check`` raises the first."""
    from dataclasses import fields

    from coevo.config.schema import RULES, TrainConfig, allowed, resolve, violations

    assert list(violations(compose_cfg([]))) == []
    cfg = compose_cfg(["trainer.beta=-1", "rollout.attempts=0", "trainer.kernel=cuda"])
    assert list(violations(cfg)) == [
        "config rollout.attempts=0 is not allowed; it must be >= 1",
        "config trainer.beta=-1.0 is not allowed; it must be >= 0",
        "config trainer.kernel='cuda' is not allowed; choose one of ['auto', 'reference', 'chunked', 'triton']",
    ]
    for group in (TrainConfig, *GROUPS.values()):  # every import path in the metadata resolves
        for f in fields(group):
            for rule in RULES:
                if rule in f.metadata:
                    assert resolve(f.metadata[rule]) is not None and allowed(f), f.name


def test_a_stored_run_config_loads_without_the_fields_this_version_no_longer_has(tmp_path):
    """A run directory written by an earlier version holds fields that were removed since; reading
    it (scripts/internalisation.py, coevo report) ignores them, silently, and types the rest."""
    import warnings

    import yaml

    from coevo.config.schema import load_run_config, stale_fields
    from coevo.loop.build import write_config

    cfg = compose_cfg(["experiment=smoke", f"run_dir={tmp_path}"])
    write_config(tmp_path, cfg)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    saved["trainer"].update(pack_calls=True, share_prefix=True)  # as an earlier version recorded them
    saved["evolution"].update(stat_alpha=0.1, patience_rounds=1000)
    saved["rollout"]["engine"] = "cached"
    saved["retired_top_level_field"] = 3
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    assert sorted(stale_fields(saved)) == ["evolution.patience_rounds", "evolution.stat_alpha",
                                           "retired_top_level_field", "rollout.engine", "trainer.pack_calls",
                                           "trainer.share_prefix"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning spam
        for path in (tmp_path, tmp_path / "config.yaml"):
            loaded = load_run_config(path)
            assert isinstance(loaded, TrainConfig) and loaded == cfg
    saved["trainer"]["lr"] = "fast"  # the fields that still exist are typed as ever
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    with pytest.raises(Exception, match="lr"):
        load_run_config(tmp_path)


def test_every_field_is_documented():
    rows = describe(TrainConfig)
    assert len(rows) > 60
    assert all(help_text for _, _, help_text in rows), [k for k, _, h in rows if not h]


def test_a_mode_says_once_what_it_switches_on():
    from coevo.config.mode import Mode
    from coevo.config.schema import MODES

    table = {m: (Mode(m).trains, Mode(m).evolves, Mode(m).unscaffolds) for m in MODES}
    assert table == {"coevolve": (True, True, True), "harness_only": (False, True, True),
                     "model_only": (True, False, True), "static": (False, False, False)}
    with pytest.raises(ValueError, match="mode='both'"):
        Mode("both")
