"""Cluster launches of train.py, checked without a GPU: accelerate configs, Hydra overrides, memory sizing.

The worked example of docs/gpu-cluster.md, which shows the same commands and table:

- ``check_accelerate_config``: each accelerate config in configs/accelerate/ is read by accelerate's own
  parser (it refuses unknown keys), and every ``fsdp_config`` / ``deepspeed_config`` key must be an
  ``accelerate launch`` option with an allowed value;
- ``LAUNCHES``: the train.py commands of the guide; ``compose`` builds each one's config with Hydra's
  compose API over configs/ and runs ``coevo.loop.config_check.check`` on it, as train.py does before any work;
- ``memory_table``: the guide's memory arithmetic for 0.5B-8B models. Estimates, not measurements.

    python -m examples.gpu_cluster
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE_CONFIGS = ROOT / "configs" / "accelerate"
GIB = 2**30


# ------------------------------------------------------------------------------ accelerate configs
def allowed_values() -> dict[str, tuple[Any, ...]]:
    """Values accelerate accepts for the enumerated keys the sample configs use."""
    from accelerate.utils import constants

    return {"fsdp_sharding_strategy": tuple(constants.FSDP_SHARDING_STRATEGY),
            "fsdp_auto_wrap_policy": tuple(constants.FSDP_AUTO_WRAP_POLICY),
            "fsdp_state_dict_type": tuple(constants.FSDP_STATE_DICT_TYPE),
            "fsdp_backward_prefetch": tuple(constants.FSDP_BACKWARD_PREFETCH),
            "fsdp_version": (1, 2), "zero_stage": (0, 1, 2, 3),
            "offload_optimizer_device": ("none", "cpu", "nvme"), "offload_param_device": ("none", "cpu", "nvme")}


def check_accelerate_config(path: Path) -> Any:
    """accelerate's ``ClusterConfig`` for ``path``; ValueError when a key or value is one accelerate
    would not take (nested keys become ``accelerate launch`` options, ``fsdp_`` prefixed)."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    config = load_config_from_file(str(path))  # unknown top-level keys raise here
    options = {action.dest for action in launch_command_parser()._actions}
    allowed = allowed_values()
    for section in ("fsdp_config", "deepspeed_config"):
        for key, value in getattr(config, section).items():
            option = key if section == "deepspeed_config" or key.startswith("fsdp_") else f"fsdp_{key}"
            if option not in options:
                raise ValueError(f"{path.name}: {section}.{key} is not an accelerate launch option")
            if option in allowed and value not in allowed[option]:
                raise ValueError(f"{path.name}: {section}.{key}={value!r}; accelerate takes {list(allowed[option])}")
    if config.num_processes < config.num_machines:
        raise ValueError(f"{path.name}: num_processes counts every process on every machine")
    return config


# ------------------------------------------------------------------------------------ launches
@dataclass(frozen=True)
class Launch:
    """A train.py command: ``prefix`` (the launcher) and Hydra overrides; ``sweep`` values make it a
    ``-m`` multirun, one run per combination."""

    prefix: str
    overrides: tuple[str, ...]
    sweep: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def command(self) -> str:
        swept = [f"{key}={','.join(values)}" for key, values in self.sweep]
        return " ".join([self.prefix, "train.py", *(["-m"] if swept else []), *swept, *self.overrides])

    def override_sets(self) -> list[list[str]]:
        keys = [key for key, _ in self.sweep]
        combos = itertools.product(*(values for _, values in self.sweep)) if self.sweep else [()]
        return [[*self.overrides, *(f"{k}={v}" for k, v in zip(keys, combo, strict=False))] for combo in combos]


MODEL = "model.name=/models/Qwen2.5-1.5B-Instruct"
LAUNCHES: dict[str, Launch] = {
    "cpu_ddp_smoke": Launch("accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no "
                            "--dynamo_backend no", ("experiment=smoke",)),
    "one_gpu": Launch("python", (MODEL, "rollout=vllm", "logger=wandb", "name=qwen1.5b-1gpu")),
    "ddp_colocated": Launch("accelerate launch --config_file configs/accelerate/ddp.yaml",
                            (MODEL, "env=reasoning", "rollout=vllm", "rollout.vllm_gpu_memory_utilization=0.3",
                             "batch_tasks=32", "rollout.attempts=8", "trainer.micro_batch_size=8", "logger=wandb",
                             "logger.project=coevo", "name=qwen1.5b-ddp")),
    "fsdp2": Launch("accelerate launch --config_file configs/accelerate/fsdp2.yaml",
                    ("model.name=/models/Llama-3.1-8B-Instruct", "model.lora=false", "env=reasoning", "batch_tasks=32",
                     "rollout.attempts=8", "trainer.micro_batch_size=4", "logger=wandb", "name=llama8b-fsdp2")),
    "cpu_fsdp2_smoke": Launch("accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no "
                              "--dynamo_backend no", ("experiment=smoke", "trainer.sharding=fsdp2")),
    "server": Launch("CUDA_VISIBLE_DEVICES=0 python",
                     (MODEL, "rollout=vllm", "rollout.vllm_mode=server", "rollout.vllm_server_url=http://127.0.0.1:8000",
                      "name=qwen1.5b-server")),
    "two_nodes": Launch("accelerate launch --config_file configs/accelerate/ddp_2nodes.yaml --machine_rank $NODE_RANK "
                        "--main_process_ip $MASTER_ADDR", (MODEL, "rollout=vllm", "logger=wandb", "name=qwen1.5b-2n")),
    "two_nodes_server": Launch("python", ("model.name=/models/Qwen2.5-7B-Instruct", "rollout=vllm",
                                          "rollout.vllm_mode=server", "rollout.vllm_server_url=http://$VLLM_NODE:8000",
                                          "batch_tasks=32", "rollout.attempts=8", "logger=wandb",
                                          "name=qwen7b-2n-server")),
    "sweep": Launch("python", ("logger=wandb", "logger.group=lr-sweep", "name=lr-sweep"),
                    sweep=(("trainer.lr", ("1e-5", "5e-5")), ("seed", ("0", "1", "2")))),
    "slurm_sweep": Launch("python", ("hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu",
                                     "hydra.launcher.gpus_per_node=1", "hydra.launcher.cpus_per_task=8",
                                     "hydra.launcher.mem_gb=64", "hydra.launcher.timeout_min=240",
                                     "hydra.launcher.max_num_timeout=3", MODEL, "logger=wandb",
                                     "logger.group=lr-sweep", "name=lr-sweep"),
                          sweep=(("trainer.lr", ("1e-5", "5e-5")), ("seed", ("0", "1", "2")))),
}
"""The commands docs/gpu-cluster.md shows (tests check that it shows exactly these)."""


def compose(overrides: list[str]) -> Any:
    """The ``TrainConfig`` train.py would run with ``overrides``, after ``coevo.loop.config_check.check``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from coevo.config.schema import register
    from coevo.loop.build import to_config
    from coevo.loop.config_check import check

    register()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = to_config(hydra_compose("train", overrides=["run_dir=/tmp/coevo-compose-check", *overrides]))
    check(cfg)
    return cfg


# -------------------------------------------------------------------------------- memory sizing
@dataclass(frozen=True)
class Arch:
    """Shapes from each model's config.json (check yours: they decide every number below)."""

    name: str
    vocab: int
    hidden: int  # H
    layers: int  # L
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # I, the SwiGLU MLP width
    tied: bool  # LM head shares the embedding matrix
    qkv_bias: bool


ARCHS = (
    Arch("Qwen2.5-0.5B", 151936, 896, 24, 14, 2, 64, 4864, True, True),
    Arch("Qwen2.5-1.5B", 151936, 1536, 28, 12, 2, 128, 8960, True, True),
    Arch("Qwen2.5-3B", 151936, 2048, 36, 16, 2, 128, 11008, True, True),
    Arch("Qwen2.5-7B", 152064, 3584, 28, 28, 4, 128, 18944, False, True),
    Arch("Llama-3.1-8B", 128256, 4096, 32, 32, 8, 128, 14336, False, False),
    Arch("Qwen2.5-32B", 152064, 5120, 64, 40, 8, 128, 27648, False, True),
)


def params(a: Arch) -> int:
    """Embedding (+ untied head) + L x (q, k, v, o projections and biases, 3 MLP matrices, 2 norms) + final norm."""
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    attention = 2 * a.hidden * q + 2 * a.hidden * kv + ((q + 2 * kv) if a.qkv_bias else 0)
    return a.vocab * a.hidden * (1 if a.tied else 2) + a.layers * (attention + 3 * a.hidden * a.intermediate
                                                                     + 2 * a.hidden) + a.hidden


def lora_params(a: Arch, r: int = 16) -> int:
    """r x (in + out) per adapted matrix; coevo's apply_lora adapts q, k, v and o of every layer."""
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    return a.layers * r * (2 * (a.hidden + q) + 2 * (a.hidden + kv))


def activation_bytes(a: Arch, tokens: int) -> int:
    """bf16 tensors a Llama/Qwen2 block keeps for backward, per token: attention 4H + 2·kv_heads·head_dim
    (norm input and output, q/k/v, attention output), MLP 2H + 4I (norm input and output, gate, up, act(gate),
    their product); no T² term (SDPA/flash attention) and no activation checkpointing (coevo enables none)."""
    return tokens * a.layers * 2 * (6 * a.hidden + 4 * a.intermediate + 2 * a.kv_heads * a.head_dim)


def kv_bytes_per_token(a: Arch) -> int:
    """vLLM's bf16 KV cache: keys and values of every layer's kv heads."""
    return 2 * a.layers * a.kv_heads * a.head_dim * 2


def estimate(a: Arch, *, tokens: int = 8 * 1024, r: int = 16, gpu_gib: float = 80.0, vllm_share: float = 0.3
             ) -> dict[str, float]:
    """GiB per GPU under DDP (a full replica on each) with bf16 weights (model.dtype=auto on CUDA)."""
    p = params(a)
    weights = 2 * p
    full = weights + 2 * p + 2 * 2 * p  # + bf16 gradients + AdamW's two moments in the parameter dtype
    lora = weights + 16 * lora_params(a, r)  # + fp32 adapter: weight, gradient, two moments (4 bytes each)
    vllm_kv = vllm_share * gpu_gib * GIB - weights  # the engine's share holds its own copy of the weights
    return {"params_b": p / 1e9, "weights": weights / GIB, "full": full / GIB, "lora": lora / GIB,
            "activations": activation_bytes(a, tokens) / GIB, "kv_kib_per_token": kv_bytes_per_token(a) / 1024,
            "kv_tokens_k": max(vllm_kv, 0) / kv_bytes_per_token(a) / 1000}


def memory_table(tokens: int = 8 * 1024) -> str:
    """The guide's table, in Markdown."""
    rows = ["| model | params | bf16 weights | full fine-tune: + grads + AdamW | LoRA r=16: + adapter state | "
            f"activations, {tokens} tokens | vLLM KV per token | KV tokens in 0.3 x 80 GiB |",
            "|---|---|---|---|---|---|---|---|"]
    for a in ARCHS:
        e = estimate(a, tokens=tokens)
        rows.append(f"| {a.name} | {e['params_b']:.2f} B | {e['weights']:.1f} GiB | {e['full']:.1f} GiB | "
                    f"{e['lora']:.1f} GiB | {e['activations']:.1f} GiB | {e['kv_kib_per_token']:.0f} KiB | "
                    f"{e['kv_tokens_k']:.0f} k |")
    return "\n".join(rows)


def sharded_estimate(a: Arch, *, gpus: int = 8, tokens: int = 8 * 1024, r: int = 16) -> dict[str, float]:
    """GiB per GPU for the three ways to fit a large model, bf16 weights (model.dtype=auto on CUDA):

    - DDP + LoRA: the whole frozen model on every GPU, the fp32 adapter state beside it;
    - FSDP2 (coevo's ``trainer.sharding=fsdp2``): weights, gradients and AdamW moments in the
      parameter dtype, 8·P, divided over the GPUs, plus what is gathered at once: the root unit
      (embeddings and head, kept for the loss) and two decoder layers (the one computing and the next
      prefetched); rank 0 also holds a whole bf16 copy (2·P) to generate with;
    - DeepSpeed ZeRO-3 (not supported by coevo; for comparison): bf16 weights and gradients plus fp32
      master weights and moments, 16·P, divided over the GPUs.
    Activations (one micro-batch of ``tokens``) are per GPU in every case."""
    p, per_layer = params(a), (params(a) - a.vocab * a.hidden * (1 if a.tied else 2) - a.hidden) // a.layers
    root = 2 * a.vocab * a.hidden * (1 if a.tied else 2)
    gathered = root + 2 * 2 * per_layer
    return {"params_b": p / 1e9, "ddp_lora": (2 * p + 16 * lora_params(a, r)) / GIB,
            "fsdp2_full": (8 * p / gpus + gathered) / GIB, "fsdp2_lora": (2 * p / gpus + 16 * lora_params(a, r) / gpus
                                                                           + gathered) / GIB,
            "rollout_copy": 2 * p / GIB, "zero3_full": (16 * p / gpus + gathered) / GIB,
            "activations": activation_bytes(a, tokens) / GIB}


def sharded_table(gpus: int = 8, tokens: int = 8 * 1024) -> str:
    """The guide's table for sharded training, in Markdown (8B and 32B)."""
    rows = [f"| model ({gpus} GPUs) | DDP + LoRA | FSDP2 full fine-tune | FSDP2 + LoRA | ZeRO-3 full fine-tune "
            f"(comparison) | + activations, {tokens} tokens | + rank 0's rollout copy (FSDP2) |",
            "|---|---|---|---|---|---|---|"]
    for a in ARCHS:
        if a.name not in ("Llama-3.1-8B", "Qwen2.5-32B"):
            continue
        e = sharded_estimate(a, gpus=gpus, tokens=tokens)
        rows.append(f"| {a.name} | {e['ddp_lora']:.1f} GiB | {e['fsdp2_full']:.1f} GiB | {e['fsdp2_lora']:.1f} GiB | "
                    f"{e['zero3_full']:.1f} GiB | {e['activations']:.1f} GiB | {e['rollout_copy']:.1f} GiB |")
    return "\n".join(rows)


def main() -> dict[str, Any]:
    configs = {p.name: check_accelerate_config(p) for p in sorted(ACCELERATE_CONFIGS.glob("*.yaml"))}
    for name, c in configs.items():
        print(f"{name}: {c.distributed_type.value}, {c.num_processes} processes on {c.num_machines} machine(s)")
    composed = {}
    for name, launch in LAUNCHES.items():
        composed[name] = [compose(overrides) for overrides in launch.override_sets()]
        print(f"{name} ({len(composed[name])} run(s)): {launch.command()}")
    table, sharded = memory_table(), sharded_table()
    print(table)
    print(sharded)
    return {"configs": configs, "composed": composed, "table": table, "sharded_table": sharded}


if __name__ == "__main__":
    main()
