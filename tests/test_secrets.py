"""Secrets never reach what a run writes: key-like config values are refused (naming the field, never
the value) before Hydra or the run writes anything, and secret environment values are redacted from
configs, logs and exports. The end-to-end test plants unique keys in the environment and in config
overrides, runs a smoke run with W&B offline plus every export, and reads back every byte written."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir

import coevo
from coevo.config.schema import register
from coevo.envs.base import Env
from coevo.safety.refusal import (
    RefuseSecrets,
    SecretInConfigError,
    find_in_overrides,
    find_secrets,
    looks_like_key,
    refuse_secrets,
    secret_reason,
)
from coevo.safety.secrets import REDACTED, RedactingFilter, is_secret_name, redact
from tests.test_config import CONFIGS, EXTRA, compose_cfg, options

ROOT = Path(__file__).resolve().parents[1]
OPENAI_KEY = "sk-proj-" + "Zq7Rk2Vw9Xc4Bn8Lm3Hd6Tf1Py5Gs0Ja"
HEX_KEY = "3f9c2b1d4e5f60718293a4b5c6d7e8f90a1b2c3d"  # the shape of a W&B API key


# ------------------------------------------------------------------------------ detection
def test_secret_names_are_whole_words() -> None:
    for name in ("OPENAI_API_KEY", "WANDB_API_KEY", "HF_TOKEN", "apiKey", "client_secret", "DB_PASSWORD", "token",
                 "SERVICE_KEY", "PGPASSWORD", "MYSQL_PWD", "DB_PASSWD", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN",
                 "GOOGLE_APPLICATION_CREDENTIALS", "SENTRY_DSN", "HTTP_AUTH", "MYSECRET", "STRIPE_APIKEY"):
        assert is_secret_name(name), name
    for name in ("max_new_tokens", "tokenizer", "keyboard", "keep_truncated", "TOKENIZERS_PARALLELISM", "MONKEY",
                 "PWD", "OLDPWD", "SSH_AUTH_SOCK", "HF_TOKEN_PATH", "api_key_env", "exclude_keys",
                 "TOX_TESTENV_PASSENV"):
        assert not is_secret_name(name), name


def test_secret_values_are_values_of_secret_named_variables(tmp_path: Path) -> None:
    from coevo.safety.secrets import secret_env_values

    (tmp_path / "gcp.json").write_text("{}")
    environ = {"SERVICE_KEY": "svc-0123456789", "PGPASSWORD": "correct horse", "PWD": "/home/someone/work",
               "SSH_AUTH_SOCK": "/tmp/ssh-XXXX/agent.1", "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "gcp.json"),
               "GPG_KEY": "short", "HOME": "/home/someone"}
    assert secret_env_values(environ) == ["svc-0123456789", "correct horse"]  # locations and short values are not


def test_remembered_secrets_are_redacted_after_the_variable_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    import coevo.safety.secrets as secrets

    monkeypatch.setattr(secrets, "_REMEMBERED", set())
    monkeypatch.setenv("SERVICE_KEY", HEX_KEY)
    secrets.remember_secrets()  # what a run does when it starts
    monkeypatch.delenv("SERVICE_KEY")
    assert redact(f"x{HEX_KEY}y") == f"x{REDACTED}y"


@pytest.mark.parametrize("value", [
    OPENAI_KEY, "sk-ant-api03-abcdefghijklmnopqrstuv", "hf_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3", "ghp_" + "x" * 36,
    "AKIAIOSFODNN7EXAMPLE", "Bearer abcdefghijklmnop1234", HEX_KEY, "Xk29fLm3Qz8pRt5Vw1Yb7Nc4Hd6Jg0Ks2Lq9Mz",
    "https://user:hunter2@example.com/v1", "http://host/v1?api_key=abc", "http://host/v1?key=abc",
    f"prefix {OPENAI_KEY} suffix", f"a,{HEX_KEY}",
])
def test_key_shapes_are_recognised(value: str) -> None:
    assert looks_like_key(value)


@pytest.mark.parametrize("value", [
    "Qwen/Qwen2.5-7B-Instruct", "http://localhost:8000/v1", "http://127.0.0.1:8000", "experiment_2024_10_01_lr1e5_long",
    "runs/coevo", "123e4567-e89b-12d3-a456-426614174000", "d9bf3f6380661263", "task-abcdefghijklmnopqrstu1",
    f"/root/.cache/huggingface/hub/models--org--m/snapshots/{HEX_KEY}", "${hydra:runtime.output_dir}",
    "OPENAI_API_KEY", "basic_arithmetic", "http://host/v1?model=m&stream=true",
])
def test_ordinary_values_are_not_keys(value: str) -> None:
    assert looks_like_key(value) is None


@pytest.mark.parametrize(("group", "option"), options())
def test_no_shipped_config_is_refused(group: str, option: str) -> None:
    from dataclasses import asdict

    assert find_secrets(asdict(compose_cfg([f"{group}={option}", *EXTRA.get(f"{group}/{option}", [])])), {}) == []


def test_an_env_name_field_holds_a_name() -> None:
    assert secret_reason("meta_agent.api_key_env", "OPENAI_API_KEY", {}) is None
    assert secret_reason("meta_agent.api_key_env", "MY_ENDPOINT_KEY_2", {}) is None
    for value in (OPENAI_KEY, HEX_KEY, "not a name"):
        assert "NAME of an environment variable" in secret_reason("meta_agent.api_key_env", value, {})


def test_values_of_secret_environment_variables_are_found_anywhere() -> None:
    environ = {"MY_SERVICE_TOKEN": "plainwords", "TOKENIZERS_PARALLELISM": "false", "HF_TOKEN_PATH": "/data/hf/tok"}
    assert "MY_SERVICE_TOKEN" in secret_reason("meta_agent.url", "http://plainwords.example/v1", environ)
    assert secret_reason("model.name", "/data/hf/tok/../model", environ) is None  # a location, not a secret
    assert secret_reason("env.args.flag", "false", environ) is None  # not secret-named, and too short anyway
    assert "secret-named field" in secret_reason("env.args.hf_token", "anything", {})


def test_config_yaml_names_the_key_variable() -> None:
    from coevo.report.tracking import scrub

    scrubbed = scrub({"meta_agent": {"api_key_env": "OPENAI_API_KEY", "api_key": "x"}})
    assert scrubbed == {"meta_agent": {"api_key_env": "OPENAI_API_KEY", "api_key": REDACTED}}  # a name, not a key


def test_a_harness_file_holding_a_secret_value_is_refused(tmp_path: Path) -> None:
    from coevo.harness.defaults import BUILTIN_HARNESSES

    harness = BUILTIN_HARNESSES["lenient"]()
    path = tmp_path / "h.yaml"
    path.write_text(harness.to_yaml())
    environ = {"SERVICE_KEY": HEX_KEY}
    refuse_secrets({"harness": {"start": str(path)}}, environ=environ)  # nothing secret in it
    keyed = harness.set_param("system_prompt", "template", f"Call the service with key {HEX_KEY}.")
    path.write_text(yaml.safe_dump(keyed.to_dict()))  # as a user wrote it (to_yaml would redact the key)
    with pytest.raises(SecretInConfigError, match="harness.start: the harness file holds the value of the "
                                                  "environment variable SERVICE_KEY") as err:
        refuse_secrets({"harness": {"start": str(path)}}, environ=environ)
    assert HEX_KEY not in str(err.value)


def test_refusal_names_every_field_and_no_value() -> None:
    config = {"meta_agent": {"api_key_env": OPENAI_KEY, "url": "http://localhost:8000/v1"},
              "logger": {"tags": ["ok", HEX_KEY]}, "env": {"args": {"api_token": "x"}}}
    with pytest.raises(SecretInConfigError) as err:
        refuse_secrets(config, ["meta_agent.api_key_env=" + OPENAI_KEY, "+hydra.job.env_set.HF_TOKEN=hf_abc"], {})
    message = str(err.value)
    for field in ("meta_agent.api_key_env:", "logger.tags.1:", "env.args.api_token:", "hydra.job.env_set.HF_TOKEN"):
        assert field in message, field
    assert "meta_agent.api_key_env (command-line override)" not in message  # one line per field
    assert OPENAI_KEY not in message and HEX_KEY not in message and "hf_abc" not in message
    assert find_in_overrides(["logger.group=a," + HEX_KEY, "~logger.tags", "rounds=3"], {}) == [
        ("logger.group (command-line override)", "it looks like a long opaque token")]


def test_the_hydra_callback_exits_before_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    register()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=smoke", f"logger.group={HEX_KEY}"], return_hydra_config=True)
        clean = compose("train", overrides=["experiment=smoke"], return_hydra_config=True)
    assert "refuse_secrets" in cfg.hydra.callbacks  # configs/train.yaml registers it
    with pytest.raises(SystemExit, match=r"logger\.group: it looks like a long opaque token") as err:
        RefuseSecrets().on_run_start(cfg)
    assert HEX_KEY not in str(err.value)
    RefuseSecrets().on_multirun_start(clean)  # nothing to refuse: returns


def test_coevo_run_refuses_before_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    cfg = compose_cfg(["experiment=smoke", f"meta_agent.url=http://h/{OPENAI_KEY}/v1", f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(SecretInConfigError, match="meta_agent.url: it holds the value of the environment variable "
                                                  "OPENAI_API_KEY"):
        coevo.run(cfg)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ redaction
def test_redact_replaces_secret_values_and_leaves_numbers() -> None:
    data = {"a": [f"x{OPENAI_KEY}y", 3, 2.5, None], "ids": [1, 2, 3], "api_key": "literal", "t": (OPENAI_KEY,)}
    assert redact(data, [OPENAI_KEY]) == {"a": [f"x{REDACTED}y", 3, 2.5, None], "ids": [1, 2, 3], "api_key": "literal",
                                          "t": (REDACTED,)}
    assert redact(data, [OPENAI_KEY], by_name=True)["api_key"] == REDACTED
    assert data["a"][0] == f"x{OPENAI_KEY}y"  # a copy


def keyed_trace(key: str, tok) -> "Trace":  # noqa: F821 - imported where used
    """Two model calls whose prompt shows ``key`` (a system prompt quoting it); the first call's
    completion repeats it."""
    from coevo.agent.trace import ModelCall, Trace
    from coevo.policy.chat import render_prompt

    messages = [{"role": "system", "content": "Be careful. " * 40 + f"The service key is {key}."},
                {"role": "user", "content": "What is 2+3?"}]
    prompt = render_prompt(tok, messages, True)
    texts = [f"The key is {key}. <answer>5</answer>", "<answer>5</answer>"]
    completions = [tok.encode(text, add_special_tokens=False) for text in texts]
    calls = [ModelCall(s, messages, list(prompt), ids, [-0.5] * len(ids), text, "stop")
             for s, (text, ids) in enumerate(zip(texts, completions, strict=True))]
    return Trace("t0", "task", "arithmetic", "train", "h" * 16, "base", "0", model_calls=calls,
                 messages=[*messages, {"role": "assistant", "content": texts[0]}], final_answer="5")


def decoded(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def test_redact_trace_re_encodes_only_the_tokens_that_show_the_key() -> None:
    from coevo.policy.tiny import tiny_tokenizer
    from coevo.safety.traces import redact_trace

    tok = tiny_tokenizer()
    trace = keyed_trace(OPENAI_KEY, tok)
    assert redact_trace(trace, tok, ["not-in-it-0123456789"]) is trace  # nothing to redact: the same object, no copy
    clean = redact_trace(trace, tok, [OPENAI_KEY])
    assert OPENAI_KEY not in str(clean.to_dict()) and OPENAI_KEY in str(trace.to_dict())  # a copy
    for before, call in zip(trace.model_calls, clean.model_calls, strict=True):
        text = decoded(tok, call.prompt_ids)
        assert OPENAI_KEY not in text and f"The service key is {REDACTED}." in text
        assert text == decoded(tok, before.prompt_ids).replace(OPENAI_KEY, REDACTED)
        head = next(i for i, (x, y) in enumerate(zip(before.prompt_ids, call.prompt_ids, strict=True)) if x != y)
        assert head > 100 and before.prompt_ids[-8:] == call.prompt_ids[-8:]  # the tokens around it are untouched
    first, second = clean.model_calls
    assert decoded(tok, first.completion_ids) == f"The key is {REDACTED}. <answer>5</answer>"
    assert not first.trainable and first.sampler_logprobs is None  # no longer what the model sampled
    assert second.trainable and second.completion_ids == trace.model_calls[1].completion_ids
    assert second.sampler_logprobs == trace.model_calls[1].sampler_logprobs  # prompt alone changed: still trained
    # without a tokenizer, a call that showed the key keeps no ids at all
    bare = redact_trace(trace, None, [OPENAI_KEY])
    assert all(c.prompt_ids == [] and c.completion_ids == [] and not c.trainable for c in bare.model_calls)


def test_references_are_stored_redacted(tmp_path: Path) -> None:
    from coevo.evolution.reference import ReferenceStore
    from coevo.policy.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVICE_KEY", OPENAI_KEY)
        store = ReferenceStore(tmp_path / "refs", tokenizer=tok)
        stored = store.put("task", keyed_trace(OPENAI_KEY, tok))
    data = b"".join(f.read_bytes() for f in (tmp_path / "refs").iterdir())
    assert OPENAI_KEY.encode() not in data and REDACTED.encode() in data
    again = store.get("task")
    assert again == stored and all(OPENAI_KEY not in decoded(tok, c.prompt_ids) for c in again.model_calls)


def test_checkpoint_state_and_meta_cache_are_written_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from coevo.meta.cache import CallCache
    from coevo.rundir import checkpoint

    monkeypatch.setenv("PGPASSWORD", HEX_KEY)
    checkpoint.commit(tmp_path / "ckpt", 0, {"next_round": 1, "notes": {"t": f"db password {HEX_KEY}"}})
    cache = CallCache(tmp_path / "cache")
    cache.put("m", "plan", [{"role": "user", "content": HEX_KEY}], {}, f"the key was {HEX_KEY}", 1, 1)
    assert cache.get("m", "plan", [{"role": "user", "content": HEX_KEY}], {}).text == f"the key was {REDACTED}"
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert len(files) == 3 and not [f for f in files if HEX_KEY.encode() in f.read_bytes()]
    assert checkpoint.load_state(checkpoint.latest(tmp_path / "ckpt"))["notes"] == {"t": f"db password {REDACTED}"}


def test_wandb_metrics_tables_and_staged_artifacts_are_redacted(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """wandb stages an artifact's files outside the run directory (its data dir, and first a temp dir):
    the harness YAML must be redacted before wandb copies it anywhere."""
    import tempfile

    from coevo.harness.defaults import BUILTIN_HARNESSES
    from coevo.report.tracking import WandbTracker
    from coevo.rundir.records import RoundRecord

    key = f"svc-{uuid.uuid4().hex}"
    (tmp_path / "netrc").write_text("")
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SERVICE_KEY", key)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var, sub in (("WANDB_DIR", "dir"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(var, str(tmp_path / "wandb_env" / sub))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where new_file writes first
    harness = BUILTIN_HARNESSES["lenient"]().set_param("system_prompt", "template", f"Use the key {key}.")
    tracker = WandbTracker("coevo-test", tmp_path / "run", config={"name": "r"}, mode="offline")
    try:
        tracker.log_harness(harness, round=-1, variant="base", how="start")
        tracker.log_round(RoundRecord.from_dict({
            "round": 0, "mode": "coevolve", "model_version": 0, "seconds": {}, "val": None, "test": None,
            "train": {"pass_rate": 0.0, "mean_reward": 0.0, "n_traces": 0, "outcomes": {}},
            "variants": {"base": f"saw {key}"}, "by_variant": {}, "grpo": None, "meta_tokens": {}, "buffer": None,
            "evolve": {"round": 0, "verdicts": [], "shipped": [], "spawned": [], "warnings": [],
                       "stopped": f"stopped at {key}"}}))
        tracker.log_edits([{"round": 0, "variant": "base", "edits": f"set_param template={key}", "gate": "",
                            "ship": True, "fail_to_pass": 0, "pass_to_fail": 0, "reason": f"quoted {key}"}])
    finally:
        tracker.finish()
    staged = [f for f in (tmp_path / "wandb_env").rglob("*") if f.is_file()]
    assert any(REDACTED.encode() in f.read_bytes() for f in staged)  # the staged harness.yaml, redacted
    files = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert not [str(f.relative_to(tmp_path)) for f in files if key.encode() in f.read_bytes()]


def test_log_records_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", HEX_KEY)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("coevo.test_secrets")
    logger.addHandler(handler)
    try:
        logger.warning("request failed with key %s", HEX_KEY)
    finally:
        logger.removeHandler(handler)
    assert stream.getvalue() == f"request failed with key {REDACTED}\n"


# ------------------------------------------------------------------------------ end to end
TASK_KEYS = ("OPENAI_API_KEY", "SERVICE_KEY", "PGPASSWORD")


class KeyedArithmetic(Env):
    """The arithmetic env (``env.name=tests.test_secrets:KeyedArithmetic``) whose every task text
    quotes the values of ``TASK_KEYS``: a task that shows the agent a key (as a tool's output or a
    scraped page could) must not bring it to the buffer, references, records or exports."""

    name = "arithmetic"

    def __init__(self, **kwargs: object) -> None:
        import dataclasses

        from coevo.envs.arithmetic import ArithmeticEnv

        self._env = ArithmeticEnv(**kwargs)  # type: ignore[arg-type]
        quoted = ", ".join(f"{name}={os.environ[name]}" for name in TASK_KEYS)
        self._tasks = {t.task_id: dataclasses.replace(t, instruction=f"{t.instruction} (service: {quoted})")
                       for split in ("train", "val", "test") for t in self._env.tasks(split)}

    def tasks(self, split: str) -> list:
        return [self._tasks[t.task_id] for t in self._env.tasks(split)]

    def reset(self, task):  # noqa: ANN001, ANN201 - Env.reset
        return self._env.reset(task)


@pytest.fixture(scope="module")
def leak_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Unique keys in the environment (OPENAI_API_KEY, WANDB_API_KEY, HF_TOKEN, SERVICE_KEY, PGPASSWORD)
    of a smoke run with W&B offline whose task texts quote three of them (``KeyedArithmetic``), then
    every export of it with the variables unset (the run must have recorded nothing) and set. A second
    run must be refused: the same keys in its overrides, ``${oc.env:...}`` of SERVICE_KEY and
    PGPASSWORD, and a starting harness file whose system prompt holds OPENAI_API_KEY's value."""
    root = tmp_path_factory.mktemp("leak")
    inputs = tmp_path_factory.mktemp("leak_inputs")  # files the user wrote, holding a key: not scanned
    keys = {"OPENAI_API_KEY": f"sk-proj-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}",
            "WANDB_API_KEY": (uuid.uuid4().hex + uuid.uuid4().hex)[:40],
            "HF_TOKEN": f"hf_{uuid.uuid4().hex}",
            "SERVICE_KEY": f"svc-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:8]}",  # no key shape: refused by its name
            "PGPASSWORD": f"pg-{uuid.uuid4().hex[:20]}"}
    (root / "netrc").write_text("")
    (root / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= {**keys, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1",
            "NETRC": str(root / "netrc"), "TMPDIR": str(root / "tmp")}
    for var, sub in (("WANDB_DIR", "dir"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        env[var] = str(root / "wandb_env" / sub)
    from coevo.harness.defaults import BUILTIN_HARNESSES

    keyed = BUILTIN_HARNESSES["lenient"]().set_param(
        "system_prompt", "template", f"You are careful. The search service key is {keys['OPENAI_API_KEY']}.")
    (inputs / "keyed.yaml").write_text(yaml.safe_dump(keyed.to_dict()))  # as a user would write it

    def train(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(ROOT / "train.py"), "experiment=smoke", "rounds=1", "logger=wandb",
               "logger.mode=offline", *args]
        return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900, check=False)

    refused = train(f"hydra.run.dir={root / 'refused'}", f"meta_agent.api_key_env={keys['OPENAI_API_KEY']}",
                    f"logger.group={keys['WANDB_API_KEY']}", f"logger.tags=[ok,{keys['HF_TOKEN']}]",
                    "logger.entity=${oc.env:PGPASSWORD}", "logger.project=${oc.env:SERVICE_KEY}",
                    f"harness.start={inputs / 'keyed.yaml'}")
    ran = train(f"hydra.run.dir={root / 'run'}", "env.name=tests.test_secrets:KeyedArithmetic")
    assert ran.returncode == 0, ran.stderr[-3000:]
    from coevo.report.export import FORMATS, export

    exports = {}
    with pytest.MonkeyPatch.context() as mp:
        for name in keys:
            mp.delenv(name, raising=False)
        for fmt in FORMATS:  # a later export, where the variables are not set: the run must hold no key
            exports[fmt] = export(root / "run", root / "exports" / f"{fmt}.jsonl", fmt)
        for name, value in keys.items():
            mp.setenv(name, value)
        for fmt in FORMATS:
            export(root / "run", root / "exports" / f"{fmt}-env.jsonl", fmt)
    return {"root": root, "keys": keys, "refused": refused, "ran": ran, "exports": exports}


@pytest.mark.slow
def test_a_config_holding_a_key_is_refused_before_anything_is_written(leak_run: dict) -> None:
    refused = leak_run["refused"]
    assert refused.returncode != 0
    for field in ("meta_agent.api_key_env", "logger.group", "logger.tags.1", "logger.entity", "logger.project",
                  "harness.start"):
        assert f"{field}: " in refused.stderr, refused.stderr[-2000:]
    assert "holds the value of the environment variable PGPASSWORD" in refused.stderr
    assert "holds the value of the environment variable SERVICE_KEY" in refused.stderr
    assert not (leak_run["root"] / "refused").exists()


@pytest.mark.slow
def test_no_key_reaches_any_file_a_run_writes(leak_run: dict) -> None:
    root, keys = leak_run["root"], leak_run["keys"]
    run = root / "run"
    # the scan covers what it should: Hydra's files, the config, logs, records, lineage, references, the buffer,
    # checkpoints, the report, W&B offline files and staged artifacts, exports
    for path in (".hydra/config.yaml", ".hydra/overrides.yaml", "config.yaml", "train.log", "rounds.jsonl",
                 "lineage.jsonl", "report/summary.md", "checkpoint/latest"):
        assert (run / path).is_file(), path
    assert list((run / "checkpoint").glob("round-*/state.json")) and list((run / "lineage").glob("*.yaml"))
    assert list((run / "references").glob("*.json")) and list((run / "buffer").iterdir())
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert list((run / "wandb").glob("offline-run-*/files/output.log"))
    staged = [p for p in (root / "wandb_env" / "data" / "artifacts" / "staging").rglob("*") if p.is_file()]
    assert [p for p in staged if b"processors:" in p.read_bytes()]  # the harness artifacts, staged outside run/
    assert all(n > 0 for n in leak_run["exports"].values())
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) > 50
    leaks = [(str(p.relative_to(root)), name) for p in files for name, key in keys.items()
             if key.encode() in p.read_bytes()]
    assert not leaks, "keys found in:\n" + "\n".join(f"{path} ({name})" for path, name in leaks)
    for proc in (leak_run["refused"], leak_run["ran"]):  # nor the terminal
        assert not any(key in proc.stdout or key in proc.stderr for key in keys.values())
    assert f"config: {REDACTED}" not in (run / "config.yaml").read_text()
    assert yaml.safe_load((run / "config.yaml").read_text())["meta_agent"]["api_key_env"] == "OPENAI_API_KEY"


@pytest.mark.slow
def test_no_token_ids_decode_to_a_key(leak_run: dict) -> None:
    """Token ids are numbers on disk: decoded with the run's tokenizer, none of the buffer, the
    references or the exports shows a key, while the redacted task text is there to be seen."""
    import json

    from coevo.buffers import ReplayBuffer
    from coevo.policy.tiny import tiny_tokenizer

    root, keys, tok = leak_run["root"], leak_run["keys"], tiny_tokenizer()
    run = root / "run"
    texts = []
    with ReplayBuffer(run / "buffer", capacity=10**6) as buf:
        for trace in buf.load(buf.entries()):
            texts += [decoded(tok, c.prompt_ids) + decoded(tok, c.completion_ids) for c in trace.model_calls]
            assert trace.behaviour_logprobs is not None
    for path in (run / "references").glob("*.json"):
        calls = json.loads(path.read_text())["trace"]["model_calls"]
        texts += [decoded(tok, c["prompt_ids"]) + decoded(tok, c["completion_ids"]) for c in calls]
    for name in ("grpo", "grpo-env", "jsonl", "jsonl-env"):
        for line in (root / "exports" / f"{name}.jsonl").read_text().splitlines():
            record = json.loads(line)
            calls = record["model_calls"] if "model_calls" in record else [record]
            texts += [decoded(tok, c["prompt_ids"]) + decoded(tok, c["completion_ids"]) for c in calls]
    assert len(texts) > 10
    assert not [text for text in texts if any(key in text for key in keys.values())]
    assert sum(f"OPENAI_API_KEY={REDACTED}, SERVICE_KEY={REDACTED}, PGPASSWORD={REDACTED}" in t for t in texts) > 10
    grpo = [json.loads(line) for line in (root / "exports" / "grpo.jsonl").read_text().splitlines()]
    assert any(r["completion_mask"][0] == 1 for r in grpo)  # calls whose prompt alone showed a key still train


@pytest.mark.slow
def test_a_harness_holding_a_key_is_redacted_where_the_run_writes_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind the refusal of a starting harness that holds a key: a harness that does anyway (forced
    past the check here; in a run, an edit that quoted one) is written redacted to lineage/ and the
    checkpoint, the prompts it gave are stored with re-encoded token ids, and the checkpoint, whose
    harnesses no longer hash to the ids that ran, refuses to resume with a message that says why."""
    import coevo.loop.build as build
    from coevo.buffers import ReplayBuffer
    from coevo.policy.tiny import tiny_tokenizer
    from coevo.rundir.checkpoint import CheckpointError

    key = f"svc-{uuid.uuid4().hex}"
    monkeypatch.setenv("SERVICE_KEY", key)
    start = build.start_harness
    monkeypatch.setattr(build, "start_harness", lambda cfg: start(cfg).set_param(
        "system_prompt", "template", f"You are careful. The search service key is {key}."))
    run = tmp_path / "run"
    coevo.run(compose_cfg(["experiment=smoke", "rounds=1", f"run_dir={run}"]))
    files = [p for p in run.rglob("*") if p.is_file()]
    assert not [str(p.relative_to(run)) for p in files if key.encode() in p.read_bytes()]
    assert all(REDACTED in p.read_text() for p in (run / "lineage").glob("*.yaml"))
    tok = tiny_tokenizer()
    with ReplayBuffer(run / "buffer", capacity=10**6) as buf:
        calls = [c for t in buf.load(buf.entries()) for c in t.model_calls]
    assert calls and all(f"The search service key is {REDACTED}." in decoded(tok, c.prompt_ids) for c in calls)
    assert not [c for c in calls if key in decoded(tok, c.prompt_ids + c.completion_ids)]
    with pytest.raises(CheckpointError, match="held the value of a secret environment variable"):
        coevo.run(compose_cfg(["experiment=smoke", "rounds=2", f"run_dir={run}"]))
