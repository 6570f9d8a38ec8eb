"""Content-hash ids, YAML round trips, key-order insensitivity, lineage and diff."""

import json
import subprocess
import sys

import yaml

from coevo.harness import Harness, diff, format_diff
from coevo.harness.defaults import base_harness
from coevo.harness.library import FewShotDemos, SlidingWindowMemory


def test_id_is_stable_across_processes():
    code = "from coevo.harness.defaults import base_harness; print(base_harness().id)"
    ids = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONHASHSEED": str(seed), "PATH": ""}).stdout.strip() for seed in (1, 2)}
    assert ids == {base_harness().id}
    assert len(base_harness().id) == 16


def test_yaml_round_trip_preserves_everything():
    tricky = "line one\n  indented: {braces} and 'quotes'\ntrailing space \n\nunicode é ✓"
    h = base_harness().set_param("system_prompt", "template", tricky).insert(FewShotDemos(demos=["2+2?", "<answer>4</answer>"]))
    text = h.to_yaml()
    back = Harness.from_yaml(text)
    assert back.id == h.id
    assert back.spec() == h.spec()
    assert back.parent_id == h.parent_id and back.edit == h.edit
    assert back.get("system_prompt").config["template"] == tricky
    assert back.to_yaml() == text


def test_id_insensitive_to_key_order_and_default_spelling():
    h = base_harness()
    data = yaml.safe_load(h.to_yaml())
    shuffled = {k: data[k] for k in reversed(list(data))}
    shuffled["processors"] = [{k: p[k] for k in reversed(list(p))} | {"params": dict(reversed(list(p["params"].items())))}
                              for p in data["processors"]]
    assert Harness.from_dict(shuffled).id == h.id
    # omitting parameters that equal their defaults describes the same harness
    minimal = {"processors": [{"kind": p["kind"]} for p in data["processors"]]}
    minimal["processors"][[p["kind"] for p in data["processors"]].index("parse_retry")]["params"] = {"max_retries": 1}
    assert Harness.from_dict(minimal).id == h.id


def test_id_changes_with_content_not_metadata():
    h = base_harness()
    assert Harness(list(h), name="other").id == h.id
    assert h.set_param("step_budget", "max_steps", 7).id != h.id
    # order within a hook is content
    h2 = h.remove("loop_detection").insert(__import__("coevo.harness.library", fromlist=["LoopDetection"]).LoopDetection(), index=0)
    assert [p.name for p in h2.at("step_end")][0] == "loop_detection" and h2.id != h.id


def test_save_and_load(tmp_path):
    h = base_harness().insert(SlidingWindowMemory())
    path = h.save(tmp_path / "h.yaml")
    assert Harness.load(path) == h
    assert not list(tmp_path.glob("*.tmp"))


def test_diff_names_processor_param_and_prompt_changes():
    a = base_harness()
    b = (a.set_param("system_prompt", "template", a.get("system_prompt").config["template"] + "\nBe brief.")
          .set_param("step_budget", "max_steps", 3)
          .remove("loop_detection")
          .insert(SlidingWindowMemory()))
    changes = {(c.kind, c.processor, c.param) for c in diff(a, b)}
    assert ("prompt", "system_prompt", "template") in changes
    assert ("param", "step_budget", "max_steps") in changes
    assert ("removed", "loop_detection", None) in changes
    assert ("added", "sliding_window", None) in changes
    text = format_diff(a, b)
    assert "+Be brief." in text and "max_steps: 6 -> 3" in text
    assert diff(a, a) == [] and "no differences" in format_diff(a, a)


def test_diff_reports_moves():
    from coevo.harness.library import Journal

    a = base_harness()
    b = a.remove("journal").insert(Journal(), index=0)
    assert any(c.kind == "moved" and c.processor == "journal" for c in diff(a, b))


def test_spec_is_json_serialisable():
    """The spec survives JSON whole: read back, it builds the same harness (the id hashes every processor's config)."""
    harness = base_harness()
    again = Harness.from_dict(json.loads(json.dumps(harness.to_dict())))
    assert again.id == harness.id and [p.name for p in again.processors] == [p.name for p in harness.processors]
