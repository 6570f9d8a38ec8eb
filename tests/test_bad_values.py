"""Bad values stop a run before its first rollout (docs/RELIABILITY.md, "Bad values"): each error
names the field, the value and what is allowed. Unchecked, these would be accepted and wrong (a
negative learning rate, a validation set one task short) or fail mid-round after the round's work
is done. Configs are composed as train.py composes them; nothing here loads a model (a run that
got that far would fail on ``model.name=/no/such/model`` with a different message)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from coevo.harness import ParamError
from coevo.harness.defaults import base_harness
from coevo.harness.library.control import StepBudget
from coevo.loop.build import run, write_config
from coevo.loop.builders import start_harness
from coevo.loop.config_check import check, check_dependencies, check_triton_device
from coevo.rundir.lock import LOCK_NAME
from tests.test_config import compose_cfg

NO_MODEL = "model.name=/no/such/model"  # a run that reaches model loading fails on this instead


# ------------------------------------------------------------------------------------- check(cfg)
@pytest.mark.parametrize(("override", "message"), [
    ("trainer.warmup_steps=-5", "config trainer.warmup_steps=-5 is not allowed; it must be >= 0"),
    ("val_limit=-1", "config val_limit=-1 is not allowed; it must be >= 0, or null (all)"),
    ("test_limit=-1", "config test_limit=-1 is not allowed; it must be >= 0, or null (all)"),
    ("val_every=-1", "config val_every=-1 is not allowed; it must be >= 0"),
    ("evolution.delta=-0.1", "config evolution.delta=-0.1 is not allowed; it must be >= 0"),
    ("evolution.max_variants=0", "config evolution.max_variants=0 is not allowed; it must be >= 1"),
    ("evolution.max_proposals=-1", "config evolution.max_proposals=-1 is not allowed; it must be >= 0"),
    ("evolution.stat_tasks=0", "config evolution.stat_tasks=0 is not allowed; it must be >= 1"),
    ("evolution.stat_budget=257", "config evolution.stat_budget=257 is not allowed; it must be <= 256"),
    ("evolution.stat_budget=1", "config evolution.stat_budget=1 must be >= 2 * evolution.critic_attempts (2)"),
    ("model.lora_r=0", "config model.lora_r=0 is not allowed; it must be >= 1"),
    ("model.lora_dropout=1.0", "config model.lora_dropout=1.0 is not allowed; it must be in [0, 1)"),
    ("trainer.weight_decay=-0.1", "config trainer.weight_decay=-0.1 is not allowed; it must be >= 0"),
    ("trainer.max_grad_norm=0", "config trainer.max_grad_norm=0.0 is not allowed; it must be > 0"),
    ("trainer.eps_low=1.0", "config trainer.eps_low=1.0 is not allowed; it must be in [0, 1)"),
    ("trainer.eps_high=-0.1", "config trainer.eps_high=-0.1 is not allowed; it must be >= 0"),
    ("trainer.dual_clip=1.0", "config trainer.dual_clip=1.0 is not allowed; it must be > 1, or null (off)"),
    ("trainer.beta=-0.1", "config trainer.beta=-0.1 is not allowed; it must be >= 0"),
    ("trainer.tis_cap=0", "config trainer.tis_cap=0.0 is not allowed; it must be > 0"),
    ("trainer.lr=1e30", "config trainer.lr=1e+30 is not allowed; it must be in (0, 0.01] for adamw"),
    ("trainer.lr=0", "config trainer.lr=0.0 is not allowed; it must be in (0, 0.01] for adamw"),
    ("trainer.lr=-1e-5", "config trainer.lr=-1e-05 is not allowed; it must be in (0, 0.01] for adamw"),
])
def test_check_names_the_field_the_value_and_what_is_allowed(override, message):
    cfg = compose_cfg([override])
    with pytest.raises(ValueError) as info:
        check(cfg)
    assert message in str(info.value), str(info.value)


@pytest.mark.parametrize("override", [
    "val_limit=0", "test_limit=0", "evolution.max_proposals=0", "trainer.warmup_steps=0",
    "trainer.dual_clip=3.0", "trainer.tis_cap=2.0", "evolution.stat_budget=256", "model.lora_dropout=0.1",
    "val_limit=null", "trainer.dual_clip=null",
])
def test_the_edges_that_mean_none_or_off_pass(override):
    check(compose_cfg([override]))


@pytest.mark.parametrize("overrides", [["trainer.lr=1e-2"], ["trainer.lr=1e-7"],
                                       ["trainer.optimizer=sgd", "trainer.lr=0.5"]])
def test_learning_rates_inside_the_range_pass(overrides):
    check(compose_cfg(overrides))


def test_batch_tasks_beyond_the_buffer_names_batch_tasks_and_the_capacity_that_bounds_it():
    cfg = compose_cfg(["batch_tasks=1000", "rollout.attempts=2"])  # buffer.capacity=512
    with pytest.raises(ValueError) as info:
        check(cfg)
    message = str(info.value)
    assert message.startswith("config batch_tasks=1000 must be <= 256"), message
    assert "rollout.attempts=2 = 2000 traces" in message and "buffer.capacity=512" in message, message


def test_dynamic_sampling_reserves_room_in_the_buffer_for_its_extra_tasks():
    # (200 + 56) tasks x 2 attempts = 512 traces: just fits
    check(compose_cfg(["batch_tasks=200", "rollout.attempts=2", "rollout.signal_groups=4",
                       "rollout.max_extra_tasks=56"]))
    with pytest.raises(ValueError) as info:
        check(compose_cfg(["batch_tasks=200", "rollout.attempts=2", "rollout.signal_groups=4",
                           "rollout.max_extra_tasks=57"]))
    message = str(info.value)
    assert message.startswith("config batch_tasks=200 must be <= 199"), message
    assert "rollout.max_extra_tasks=57" in message and "= 514 traces" in message, message
    # dynamic sampling off: the reserve takes no room
    check(compose_cfg(["batch_tasks=200", "rollout.attempts=2", "rollout.max_extra_tasks=57"]))
    for bad in ("rollout.signal_groups=0", "rollout.max_extra_tasks=-1"):
        with pytest.raises(ValueError, match=bad.split("=")[0].replace(".", r"\.")):
            check(compose_cfg([bad]))


# ------------------------------------------------------------------- values the run checks itself
def test_batch_tasks_beyond_the_train_split_stops_the_run_before_the_model_and_the_run_directory(tmp_path):
    cfg = compose_cfg(["experiment=smoke", "batch_tasks=1000", "buffer.capacity=100000", NO_MODEL,
                       f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError, match=r"^config batch_tasks=1000 must be <= \d+, the train tasks of env "
                                         r"'arithmetic'$"):
        run(cfg)
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_max_new_tokens_over_the_context_window_stops_the_run_before_any_rollout_and_any_file(tmp_path):
    run_dir = tmp_path / "run"  # the tiny model's context window is 4096 tokens
    cfg = compose_cfg(["experiment=smoke", "rollout.max_new_tokens=4090", f"run_dir={run_dir}"])
    with pytest.raises(ValueError, match=r"^config rollout\.max_new_tokens=4090 does not fit the model's context "
                                         r"window: the first prompt \(task '.*' under the starting harness\) has "
                                         r"(\d+) tokens, \d+ in all, over the 4096 tokens .*set "
                                         r"rollout\.max_new_tokens <= \d+"):
        run(cfg)
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME]  # no config.yaml, references, rounds


def test_a_bad_model_name_leaves_the_run_directory_so_the_corrected_rerun_is_accepted(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=r"^config model\.name='/no/such/model'"):
        run(compose_cfg(["experiment=smoke", "mode=static", "rounds=1", NO_MODEL, f"run_dir={run_dir}"]))
    assert not (run_dir / "config.yaml").exists()
    # not refused as "a different config" (static: no GRPO step, which would move the tiny model other tests load)
    run(compose_cfg(["experiment=smoke", "mode=static", "rounds=1", f"run_dir={run_dir}"]))
    assert (run_dir / "rounds.jsonl").read_text().count("\n") == 1


def step_budget_yaml(path: Path, max_steps: int) -> Path:
    """The base harness with ``step_budget.max_steps`` written into its YAML (the algebra refuses it)."""
    text = base_harness().to_yaml()
    assert "    max_steps: 6\n" in text
    path.write_text(text.replace("    max_steps: 6\n", f"    max_steps: {max_steps}\n"))
    return path


@pytest.mark.parametrize("max_steps", [-3, 0])
def test_a_harness_yaml_with_a_step_budget_below_one_names_the_file_the_parameter_and_the_value(tmp_path, max_steps):
    path = step_budget_yaml(tmp_path / "harness.yaml", max_steps)
    cfg = compose_cfg(["experiment=smoke", f"harness.start={path}", NO_MODEL, f"run_dir={tmp_path / 'run'}"])
    with pytest.raises(ValueError) as info:
        run(cfg)
    message = str(info.value)
    assert message.startswith(f"config harness.start='{path}': [param_type] processor 'step_budget': parameter "
                              f"'max_steps' must be >= 1"), message
    assert message.endswith(f"got {max_steps}"), message
    with pytest.raises(ParamError, match="'max_steps' must be >= 1"):
        base_harness().set_param("step_budget", "max_steps", max_steps)
    assert StepBudget(max_steps=1).config["max_steps"] == 1
    ok = start_harness(compose_cfg([f"harness.start={step_budget_yaml(tmp_path / 'ok.yaml', 5)}"]))
    assert ok.get("step_budget").config["max_steps"] == 5
    # a budget below rollout.max_steps (3 in configs/train.yaml) is raised to it: one setting decides
    raised = start_harness(compose_cfg([f"harness.start={step_budget_yaml(tmp_path / 'low.yaml', 2)}"]))
    assert raised.get("step_budget").config["max_steps"] == 3


def test_resuming_with_fewer_rounds_than_completed_is_refused_and_config_yaml_kept(tmp_path):
    from coevo.rundir import checkpoint

    cfg = compose_cfg(["rounds=4", f"run_dir={tmp_path}"])
    write_config(tmp_path, cfg)
    saved = (tmp_path / "config.yaml").read_text()
    checkpoint.commit(tmp_path / "checkpoint", 2, {"next_round": 3})  # rounds 0-2 done
    with pytest.raises(ValueError, match=r"^config rounds=2 must be >= 3: .* already completed 3 rounds"):
        write_config(tmp_path, compose_cfg(["rounds=2", f"run_dir={tmp_path}"]))
    assert (tmp_path / "config.yaml").read_text() == saved
    write_config(tmp_path, compose_cfg(["rounds=3", f"run_dir={tmp_path}"]))  # as many as done: a report-only resume
    write_config(tmp_path, compose_cfg(["rounds=6", f"run_dir={tmp_path}"]))  # more: still a resumable change


def test_triton_kernel_without_cuda_names_the_field_the_device_and_the_other_kernels(monkeypatch):
    from coevo.kernels import triton_grpo

    monkeypatch.setattr(triton_grpo, "INTERPRETED", False)
    cfg = compose_cfg(["trainer.kernel=triton", "model.device=cpu"])
    check(cfg)  # the values are fine; the device is not
    with pytest.raises(ValueError, match=r"^config trainer\.kernel=triton needs a CUDA device, and "
                                         r"model\.device='cpu' is cpu here; choose one of \['auto', 'reference', "
                                         r"'chunked'\]"):
        check_dependencies(cfg)
    check_triton_device(compose_cfg(["trainer.kernel=triton", "model.device=cuda:0"]))
    monkeypatch.setattr(triton_grpo, "INTERPRETED", True)  # TRITON_INTERPRET=1 runs the kernels on CPU tensors
    check_triton_device(cfg)


# ------------------------------------------------------------------------------------------- CLI
def test_eval_with_an_unknown_split_is_a_usage_error_listing_the_splits(tmp_path):
    from coevo.cli.main import app

    result = CliRunner().invoke(app, ["eval", "--env", "arithmetic", "--model", "scripted", "--split", "foo",
                                      "--out", str(tmp_path)], terminal_width=200)
    assert result.exit_code == 2, result.output  # click's usage error, not a traceback
    assert isinstance(result.exception, SystemExit), result.exception
    text = " ".join(result.output.replace("│", " ").split())  # the error box wraps lines
    assert "--split" in text and "split must be one of ['train', 'val', 'test'], got 'foo'" in text, text


def test_eval_with_a_negative_temperature_is_a_usage_error_like_train_py(tmp_path):
    from coevo.cli.main import app

    result = CliRunner().invoke(app, ["eval", "--env", "arithmetic", "--model", "scripted", "--temperature", "-1",
                                      "--out", str(tmp_path / "out")], terminal_width=200)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert "Invalid value for '--temperature'" in text and "greater than or equal to 0" in text, text
    assert not (tmp_path / "out").exists()


def test_distributed_launches_get_what_they_ask_for_or_a_refusal_naming_why():
    from accelerate.utils import DistributedType

    from coevo.loop.config_check import check_distributed, launch_request

    # what the launcher asked for, from what accelerate launch / torchrun export
    assert launch_request({"ACCELERATE_USE_DEEPSPEED": "true", "WORLD_SIZE": "2"}) == ("deepspeed", 2)
    assert launch_request({"ACCELERATE_USE_FSDP": "true", "WORLD_SIZE": "4"}) == ("fsdp", 4)
    assert launch_request({"ACCELERATE_USE_DEEPSPEED": "false", "WORLD_SIZE": "2"}) == (None, 2)
    assert launch_request({}) == (None, 1)

    # DeepSpeed: ZeRO-3 or a refusal; a DeepSpeed launch that accelerate set up as DDP (what cpu=True did) is refused
    assert check_distributed(DistributedType.DEEPSPEED, requested="deepspeed", world_size=2, processes=2,
                             zero_stage=3) == "zero3"
    with pytest.raises(ValueError, match="ZeRO stage 2 is not supported.*stage 3 .configs/accelerate/zero3.yaml"):
        check_distributed(DistributedType.DEEPSPEED, requested="deepspeed", world_size=2, processes=2, zero_stage=2)
    with pytest.raises(ValueError, match="asks for DeepSpeed .ACCELERATE_USE_DEEPSPEED=true. but accelerate set up "
                                         "DistributedType.MULTI_CPU"):
        check_distributed(DistributedType.MULTI_CPU, requested="deepspeed", world_size=2, processes=2, zero_stage=3)
    # FSDP: version 2, also on CPU where accelerate sets up no FSDP (the trainer shards itself); version 1 refused
    assert check_distributed(DistributedType.FSDP, 2, requested="fsdp", world_size=2, processes=2) == "fsdp2"
    assert check_distributed(DistributedType.MULTI_CPU, 2, requested="fsdp", world_size=2, processes=2) == "fsdp2"
    with pytest.raises(ValueError, match="FSDP version 1 is not supported.*fsdp_version: 2"):
        check_distributed(DistributedType.FSDP, 1, requested="fsdp", world_size=2, processes=2)
    with pytest.raises(ValueError, match="FSDP version 1 is not supported"):
        check_distributed(DistributedType.MULTI_CPU, 1, requested="fsdp", world_size=2, processes=2)
    # several processes: as many ranks as were started
    with pytest.raises(ValueError, match="started 2 processes .WORLD_SIZE. but accelerate set up 1"):
        check_distributed(DistributedType.NO, world_size=2, processes=1)
    assert check_distributed(DistributedType.MULTI_CPU, world_size=2, processes=2) is None
    assert check_distributed(DistributedType.MULTI_GPU, world_size=8, processes=8) is None
    assert check_distributed(DistributedType.NO) is None


def test_trainer_sharding_must_fit_the_launch():
    import dataclasses

    from coevo.config.schema import TrainConfig
    from coevo.loop.launch import with_launch_sharding

    cfg = TrainConfig()
    assert with_launch_sharding(cfg, "zero3").trainer.sharding == "zero3"  # a DeepSpeed launch sets it
    assert with_launch_sharding(cfg, "fsdp2").trainer.sharding == "fsdp2"  # (its resharding goes to the trainer)
    multi = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, sharding="fsdp2"))
    assert with_launch_sharding(multi, None) is multi  # the CPU path: the trainer shards a DDP launch's ranks
    with pytest.raises(ValueError, match="trainer.sharding=fsdp2 does not fit a DeepSpeed ZeRO-3 launch"):
        with_launch_sharding(multi, "zero3")
    zero3 = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, sharding="zero3"))
    with pytest.raises(ValueError, match="trainer.sharding=zero3 does not fit a launch without DeepSpeed"):
        with_launch_sharding(zero3, None)


def test_an_fsdp2_launch_configs_resharding_reaches_the_trainer(monkeypatch):
    """``fsdp_reshard_after_forward`` is the launch config's (no config field repeats it): ``run`` hands
    what ``launch_accelerator`` read to ``GRPOTrainer``, which shards each layer with it."""
    from coevo.config.schema import TrainerConfig
    from coevo.policy.tiny import tiny_model, tiny_tokenizer
    from coevo.trainers import grpo, sharding

    seen = []
    monkeypatch.setattr(grpo.torch.distributed, "is_initialized", lambda: True)  # as under accelerate launch
    monkeypatch.setattr(sharding, "shard_model",
                        lambda model, *, reshard_after_forward: seen.append(reshard_after_forward))
    tok = tiny_tokenizer()
    for given, expected in (({}, True), ({"reshard_after_forward": False}, False)):
        grpo.GRPOTrainer(tiny_model(tok, seed=0), TrainerConfig(sharding="fsdp2"), pad_id=tok.pad_token_id,
                         total_steps=1, loss_horizon=None, **given)
        assert seen.pop() is expected


def test_the_agents_axis_on_an_env_without_owners_is_a_usage_error_before_the_model_loads():
    from typer.testing import CliRunner

    from coevo.cli.main import app

    out = CliRunner().invoke(app, ["stream", "--env", "arithmetic", "--axis", "agents", "--model", "scripted"])
    assert out.exit_code == 2
    assert "has no tool_owners map" in out.output and "loading model" not in out.output


def test_episodes_without_the_scaffolding_count_against_the_buffer_too():
    check(compose_cfg(["batch_tasks=32", "rollout.attempts=8", "rollout.unscaffolded_attempts=8"]))  # 32 x 16 = 512
    with pytest.raises(ValueError) as info:
        check(compose_cfg(["batch_tasks=33", "rollout.attempts=8", "rollout.unscaffolded_attempts=8"]))
    message = str(info.value)
    assert message.startswith("config batch_tasks=33 must be <= 32"), message
    assert "+ batch_tasks x rollout.unscaffolded_attempts=8 = 528 traces" in message, message
    with pytest.raises(ValueError, match="rollout.unscaffolded_attempts=-1 is not allowed; it must be >= 0"):
        check(compose_cfg(["rollout.unscaffolded_attempts=-1"]))
