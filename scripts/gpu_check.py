"""Everything GPU-only, checked and timed in one call (run it on a machine with a CUDA GPU).

    python scripts/gpu_check.py [--model smollm2|PATH] [--out DIR]

Checks, each printed as one JSON line (and collected into DIR/gpu_check.json when --out is set):
1. TransformersPolicy on CUDA: returned log-probs equal a fresh forward pass (fp32, TF32 off) at
   temperatures 1.0 and 0.7; decoded ids equal the text; throughput batched vs one at a time.
2. VLLMPolicy, colocated (when vllm is installed): the same contract against the HF forward
   (tolerance for different kernels), then weight sync: after perturbing the trainer's weights
   and calling sync_weights, vLLM's log-probs follow the new weights. Throughput.
A check whose dependency is missing is reported as skipped with the reason, never as passed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coevo.agent.policy import ChatRequest  # noqa: E402
from coevo.harness.events import SamplingParams  # noqa: E402

RESULTS: list[dict] = []


def report(name: str, **fields) -> None:
    row = {"check": name, **fields}
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


def throughput(policy, reqs) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    gens = policy.generate(reqs)
    torch.cuda.synchronize()
    return sum(len(g.completion_ids) for g in gens) / (time.perf_counter() - start)


def check_transformers(model_name: str):
    from coevo.policy.hf import TransformersPolicy
    from coevo.policy.load import load_model

    model, tok = load_model(model_name, device="cuda", dtype="float32")
    policy = TransformersPolicy(model, tok, max_batch_size=64)
    for temperature in (1.0, 0.7):
        gens = policy.generate(requests(8, temperature))
        err = max_logprob_error(model, gens, temperature)
        text_ok = all(tok.decode(g.completion_ids, skip_special_tokens=True) == g.text for g in gens)
        report("transformers_contract", temperature=temperature, max_abs_logprob_error=err,
               passed=bool(err < 1e-4 and text_ok))
    policy.generate(requests(2, 0.0))  # warm-up
    single = sum(throughput(policy, [r]) for r in requests(4, 0.0)) / 4
    report("transformers_tokens_per_s", batch1=single, batch16=throughput(policy, requests(16, 0.0)),
           batch64=throughput(policy, requests(64, 0.0)))
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
    policy = VLLMPolicy(ColocatedEngine(path, dtype="float32", gpu_memory_utilization=0.3), tok)
    gens = policy.generate(requests(8, 0.7))
    err = max_logprob_error(hf_model, gens, 0.7)
    text_ok = all(tok.decode(g.completion_ids, skip_special_tokens=True) == g.text for g in gens)
    report("vllm_contract", temperature=0.7, max_abs_logprob_error=err, passed=bool(err < 2e-2 and text_ok))
    with torch.no_grad():  # move the trainer's weights, then sync: vLLM must follow
        for p in hf_model.model.layers[-1].parameters():
            p.add_(0.05 * torch.randn_like(p))
    stale_err = max_logprob_error(hf_model, policy.generate(requests(4, 1.0)), 1.0)
    policy.sync_weights(hf_model, "perturbed")
    synced_err = max_logprob_error(hf_model, policy.generate(requests(4, 1.0)), 1.0)
    report("vllm_weight_sync", error_before_sync=stale_err, error_after_sync=synced_err,
           passed=bool(synced_err < 2e-2 and synced_err < stale_err))
    report("vllm_tokens_per_s", batch16=throughput(policy, requests(16, 0.0)), batch64=throughput(policy, requests(64, 0.0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--out", default=os.environ.get("OUT"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device; run this on a machine with an NVIDIA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    report("device", name=torch.cuda.get_device_name(), torch=torch.__version__)
    hf_model, tok = check_transformers(args.model)
    check_vllm(args.model, hf_model, tok)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_check.json").write_text(json.dumps(RESULTS, indent=2))
    failed = [r["check"] for r in RESULTS if r.get("passed") is False]
    print("gpu_check:", "FAILED " + ", ".join(failed) if failed else "all run checks passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
