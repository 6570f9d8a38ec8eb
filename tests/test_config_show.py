"""The config reference: ``show`` prints the composed defaults as valid YAML with every field's help
beside it, and ``docs/config.md`` is what ``scripts/config_reference.py`` generates from the schema."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from coevo.config.schema import GROUPS, TrainConfig, describe
from coevo.config.show import REFERENCE_DOC, compose_defaults, reference_markdown, show

ROOT = Path(__file__).resolve().parents[1]
HELP = {key: help_text for key, _, help_text in describe(TrainConfig)}


@pytest.fixture(scope="module")
def full() -> str:
    return show()


def test_show_is_yaml_of_the_composed_defaults(full: str) -> None:
    values, _ = compose_defaults()
    assert yaml.safe_load(full) == values
    assert "  lr: 0.0005  # learning rate (AdamW)\n" in full  # grpo_lora's value, the schema's help
    assert "trainer:  # configs/trainer/grpo_lora.yaml\n" in full


def test_every_field_has_its_help_comment_once(full: str) -> None:
    assert HELP  # every schema field's help: none would check nothing
    for key, help_text in HELP.items():
        group, _, leaf = key.rpartition(".")
        indent = "  " if group else ""
        hits = [line for line in full.splitlines() if line.startswith(f"{indent}{leaf}: ")
                and line.endswith(f"  # {help_text}")]
        assert len(hits) == 1, key


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_show_one_group(group: str) -> None:
    text = show(group)
    loaded = yaml.safe_load(text)
    assert list(loaded) == [group]
    assert set(loaded[group]) == {k.split(".", 1)[1] for k in HELP if k.startswith(f"{group}.")}


def test_show_with_overrides_shows_the_experiments_values() -> None:
    text = show("trainer", ["experiment=smoke"])
    assert yaml.safe_load(text)["trainer"]["lr"] == 0.001
    assert "# experiment: configs/experiment/smoke.yaml" in text


def test_an_unknown_group_names_the_allowed_groups() -> None:
    with pytest.raises(ValueError, match=r"unknown config group 'optim'; choose one of \['buffer', 'env', .*'trainer'\]"):
        show("optim")


def test_docs_config_md_is_up_to_date() -> None:
    assert REFERENCE_DOC.read_text() == reference_markdown(), (
        "docs/config.md is out of date with coevo/config/schema.py or configs/; run python scripts/config_reference.py")


def test_the_reference_documents_every_field_once() -> None:
    doc = REFERENCE_DOC.read_text()
    rows = re.findall(r"^\| `([a-z_.]+)` \|", doc, flags=re.MULTILINE)
    assert sorted(rows) == sorted(HELP)
    for group in GROUPS:
        for option in (ROOT / "configs" / group).glob("*.yaml"):
            assert f"`{group}={option.stem}`" in doc


def test_the_script_checks_and_writes(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "config.md"
    assert module.main(["--check", "--out", str(out)]) == 1  # missing counts as stale
    assert module.main(["--out", str(out)]) == 0
    assert out.read_text() == reference_markdown()
    assert module.main(["--check", "--out", str(out)]) == 0
    out.write_text(out.read_text().replace("learning rate", "LR"))
    assert module.main(["--check", "--out", str(out)]) == 1


def test_the_fields_you_should_ever_touch_head_the_reference_and_exist() -> None:
    from coevo.config.show import TOUCHED

    doc = REFERENCE_DOC.read_text()
    assert doc.index("## Fields you should ever touch") < doc.index("## Top level")
    assert 12 <= len(TOUCHED) <= 20 and all(key in HELP for key, _ in TOUCHED)
