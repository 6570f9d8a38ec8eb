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
from coevo.config import register
from coevo.secrets import (
    REDACTED,
    RedactingFilter,
    RefuseSecrets,
    SecretInConfigError,
    find_in_overrides,
    find_secrets,
    is_secret_name,
    looks_like_key,
    redact,
    refuse_secrets,
    secret_reason,
)
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
                 "PWD", "OLDPWD", "SSH_AUTH_SOCK", "HF_TOKEN_PATH", "api_key_env", "exclude_keys", "TOX_TESTENV_PASSENV"):
        assert not is_secret_name(name), name


def test_secret_values_are_values_of_secret_named_variables(tmp_path: Path) -> None:
    from coevo.secrets import secret_env_values

    (tmp_path / "gcp.json").write_text("{}")
    environ = {"SERVICE_KEY": "svc-0123456789", "PGPASSWORD": "correct horse", "PWD": "/home/someone/work",
               "SSH_AUTH_SOCK": "/tmp/ssh-XXXX/agent.1", "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "gcp.json"),
               "GPG_KEY": "short", "HOME": "/home/someone"}
    assert secret_env_values(environ) == ["svc-0123456789", "correct horse"]  # locations and short values are not


def test_remembered_secrets_are_redacted_after_the_variable_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    import coevo.secrets as secrets

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
    from coevo.tracking import scrub

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
    from coevo.policy.hf import render_prompt

    messages = [{"role": "system", "content": "Be careful. " * 40 + f"The service key is {key}."},
                {"role": "user", "content": "What is 2+3?"}]
    prompt = render_prompt(tok, messages, True)
    texts = [f"The key is {key}. <answer>5</answer>", "<answer>5</answer>"]
    calls = [ModelCall(s, messages, list(prompt), tok.encode(text, add_special_tokens=False),
                       [-0.5] * len(tok.encode(text, add_special_tokens=False)), text, "stop") for s, text in enumerate(texts)]
    return Trace("t0", "task", "arithmetic", "train", "h" * 16, "base", "0", model_calls=calls,
                 messages=[*messages, {"role": "assistant", "content": texts[0]}], final_answer="5")


def decoded(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def test_redact_trace_re_encodes_only_the_tokens_that_show_the_key() -> None:
    from coevo.policy.tiny import tiny_tokenizer
    from coevo.secrets import redact_trace

    tok = tiny_tokenizer()
    trace = keyed_trace(OPENAI_KEY, tok)
    assert redact_trace(trace, tok, ["not-in-it-0123456789"]) is trace  # nothing to redact: the same object, no copy
    clean = redact_trace(trace, tok, [OPENAI_KEY])
    assert OPENAI_KEY not in str(clean.to_dict()) and OPENAI_KEY in str(trace.to_dict())  # a copy
    for before, call in zip(trace.model_calls, clean.model_calls, strict=True):
        text = decoded(tok, call.prompt_ids)
        assert OPENAI_KEY not in text and f"The service key is {REDACTED}." in text
        assert text == decoded(tok, before.prompt_ids).replace(OPENAI_KEY, REDACTED)
        head = next(i for i, (x, y) in enumerate(zip(before.prompt_ids, call.prompt_ids)) if x != y)
        assert head > 100 and before.prompt_ids[-8:] == call.prompt_ids[-8:]  # the tokens around it are untouched
    first, second = clean.model_calls
    assert decoded(tok, first.completion_ids) == f"The key is {REDACTED}. <answer>5</answer>"
    assert not first.trainable and first.sampler_logprobs is None  # no longer what the model sampled
    assert second.trainable and second.completion_ids == trace.model_calls[1].completion_ids
    assert second.sampler_logprobs == trace.model_calls[1].sampler_logprobs  # prompt alone changed: still trained
    # without a tokenizer, a call that showed the key keeps no ids at all
    bare = redact_trace(trace, None, [OPENAI_KEY])
    assert all(c.prompt_ids == [] and c.completion_ids == [] and not c.trainable for c in bare.model_calls)


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
@pytest.fixture(scope="module")
def leak_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Unique keys in the environment (OPENAI_API_KEY, WANDB_API_KEY, HF_TOKEN) of a smoke run with
    W&B offline; the same keys in the overrides of a second run, which must be refused."""
    root = tmp_path_factory.mktemp("leak")
    keys = {"OPENAI_API_KEY": f"sk-proj-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}",
            "WANDB_API_KEY": (uuid.uuid4().hex + uuid.uuid4().hex)[:40],
            "HF_TOKEN": f"hf_{uuid.uuid4().hex}"}
    (root / "netrc").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env |= {**keys, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1",
            "NETRC": str(root / "netrc")}
    for var, sub in (("WANDB_DIR", "dir"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        env[var] = str(root / "wandb_env" / sub)

    def train(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(ROOT / "train.py"), "experiment=smoke", "rounds=1", "logger=wandb",
               "logger.mode=offline", *args]
        return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False)

    refused = train(f"hydra.run.dir={root / 'refused'}", f"meta_agent.api_key_env={keys['OPENAI_API_KEY']}",
                    f"logger.group={keys['WANDB_API_KEY']}", f"logger.tags=[ok,{keys['HF_TOKEN']}]")
    ran = train(f"hydra.run.dir={root / 'run'}")
    assert ran.returncode == 0, ran.stderr[-3000:]
    exports = {}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in keys.items():
            mp.setenv(name, value)
        from coevo.export import FORMATS, export

        for fmt in FORMATS:
            exports[fmt] = export(root / "run", root / "exports" / f"{fmt}.jsonl", fmt)
    return {"root": root, "keys": keys, "refused": refused, "ran": ran, "exports": exports}


@pytest.mark.slow
def test_a_config_holding_a_key_is_refused_before_anything_is_written(leak_run: dict) -> None:
    refused = leak_run["refused"]
    assert refused.returncode != 0
    for field in ("meta_agent.api_key_env", "logger.group", "logger.tags.1"):
        assert f"{field}: " in refused.stderr, refused.stderr[-2000:]
    assert not (leak_run["root"] / "refused").exists()


@pytest.mark.slow
def test_no_key_reaches_any_file_a_run_writes(leak_run: dict) -> None:
    root, keys = leak_run["root"], leak_run["keys"]
    run = root / "run"
    # the scan covers what it should: Hydra's files, the config, logs, records, report, W&B offline files, exports
    for path in (".hydra/config.yaml", ".hydra/overrides.yaml", "config.yaml", "train.log", "rounds.jsonl",
                 "report/summary.md"):
        assert (run / path).is_file(), path
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert list((run / "wandb").glob("offline-run-*/files/output.log"))
    assert all(n > 0 for n in leak_run["exports"].values())
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) > 50
    leaks = [(str(p.relative_to(root)), name) for p in files for name, key in keys.items()
             if key.encode() in p.read_bytes()]
    assert not leaks, "keys found in:\n" + "\n".join(f"{path} ({name})" for path, name in leaks)
    for proc in (leak_run["refused"], leak_run["ran"]):  # nor the terminal
        assert not any(key in proc.stdout or key in proc.stderr for key in keys.values())
