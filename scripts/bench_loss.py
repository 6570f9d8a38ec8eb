"""GRPO loss forward+backward, side by side: naive full logits, TRL chunked log-probs, Liger fused, ours.

    python scripts/bench_loss.py                # B=4 T=256 H=896 V=151936, then B=8 T=256; 3 rounds
    python scripts/bench_loss.py --quick        # tiny shape, one round, no liger-compiled: a smoke test
    python scripts/bench_loss.py --methods ours,ours-recompute --shapes main   # the chunked.py measurement
    python scripts/bench_loss.py --methods ours --shapes main --chunk-size 512  # another tile height

Every (method, shape) run is its own subprocess, so one method's allocator state and peak cannot leak
into another's. Peak memory is the resident-set high-water mark during one forward+backward minus
the resident set just before it, with the inputs already allocated (the kernel resets the
high-water mark through /proc/self/clear_refs; elsewhere the run is measured against ru_maxrss).
The machine's timings swing by ±50 %, so the subprocesses run round-robin (naive, trl, liger, ours,
naive, ...) for --rounds rounds and the table reports medians. Each subprocess first runs its method
once on a tiny vocabulary with the same B and T (thread pools, lazy imports, torch.compile: the
per-token shapes are the same, so nothing recompiles later) and reports that call's time as "first
call".

Methods:
- naive: ``coevo.kernels.grpo_loss_reference`` (full logits → log_softmax → gather → clipped loss);
- trl: ``trl.kernels.ChunkedLogProbFunction`` log-probs (its trainer's 32768-wide vocabulary tiles),
  with the clipped loss and KL in torch (``coevo.kernels.token_loss``, differentiated by autograd);
- liger / liger-compiled: ``LigerFusedLinearGRPOLoss`` (dapo, one sequence per chunk) with
  ``compiled=False`` / ``True``;
- ours: ``coevo.kernels.grpo_loss`` (chunked on CPU, Triton on CUDA);
- ours-recompute: ours with the gradients recomputed in the backward instead of formed in the forward
  (``chunk_pass`` twice), the alternative ``kernels/chunked.py`` documents.
All methods compute the same loss (token_mean, DAPO's normalisation = token_weights of 1/N); the
table's loss column checks it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from coevo.policy.heap import reset_high_water, status_kib

SHAPES = {
    "main": (4, 256, 896, 151936),  # Qwen2.5-0.5B's LM head
    "large": (8, 256, 896, 151936),  # twice the rows: naive grows with N, the chunked paths do not
    "quick": (2, 8, 32, 1000),
}
DEFAULT_METHODS = ("naive", "trl", "liger", "liger-compiled", "ours")
QUICK_METHODS = ("naive", "trl", "liger", "ours")  # liger-compiled spends ~30 s compiling on this CPU
BETA, TEMPERATURE, EPS = 0.04, 1.0, 0.2
# trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE (trl 1.16): the vocabulary tile its trainer uses. Importing it
# would pull in the whole trainer stack (~7 s here) for one integer.
TRL_VOCAB_TILE = 32768


@dataclass
class Inputs:
    """One micro-batch, flattened for ours/naive/trl and [B, T] for Liger."""

    b: int
    t: int
    hidden: torch.Tensor  # [N, H] leaf, requires grad
    weight: torch.Tensor  # [V, H] leaf, requires grad
    targets: torch.Tensor  # [N]
    old_logp: torch.Tensor  # [N]
    ref_logp: torch.Tensor  # [N]
    seq_advantages: torch.Tensor  # [B]
    advantages: torch.Tensor  # [N] each token carries its sequence's advantage
    token_weights: torch.Tensor  # [N] 1/N: DAPO's token-level normalisation (token_mean)

    def tokens(self) -> Any:
        """The per-token inputs as coevo.kernels.Tokens."""
        from coevo.kernels import Tokens

        return Tokens(self.targets, self.old_logp, self.advantages, self.token_weights, self.ref_logp, TEMPERATURE)


def loss_params() -> Any:
    """The benchmark's objective: symmetric clip EPS, k3 KL at BETA."""
    from coevo.kernels import LossParams

    return LossParams(eps_low=EPS, eps_high=EPS, beta=BETA)


def make_inputs(b: int, t: int, h: int, v: int, seed: int = 0) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    n = b * t
    hidden = torch.randn(n, h, generator=g).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.02).requires_grad_()
    # Logits have std ≈ 0.6 here, so logp ≈ −log V − 0.2; old/ref log-probs scattered around it make
    # some ratios clip and others not, as in a real step.
    typical = -torch.log(torch.tensor(float(v))) - 0.2
    old_logp = typical + 0.3 * torch.randn(n, generator=g)
    ref_logp = typical + 0.3 * torch.randn(n, generator=g)
    seq_adv = torch.randn(b, generator=g)
    return Inputs(
        b=b,
        t=t,
        hidden=hidden,
        weight=weight,
        targets=torch.randint(0, v, (n,), generator=g),
        old_logp=old_logp,
        ref_logp=ref_logp,
        seq_advantages=seq_adv,
        advantages=seq_adv.repeat_interleave(t),
        token_weights=torch.full((n,), 1.0 / n),
    )


def run_naive(x: Inputs) -> torch.Tensor:
    from coevo.kernels import grpo_loss_reference

    return grpo_loss_reference(x.hidden, x.weight, x.tokens(), loss_params()).loss


def run_trl(x: Inputs) -> torch.Tensor:
    from trl.kernels import ChunkedLogProbFunction

    from coevo.kernels import token_loss

    logp = ChunkedLogProbFunction.apply(
        x.hidden, x.weight, None, x.targets, TEMPERATURE, TRL_VOCAB_TILE, None, 1.0, ()
    )[0]  # [N]
    terms = token_loss(logp, x.old_logp, x.advantages, x.ref_logp, loss_params())
    return (x.token_weights * terms.loss).sum()


def _liger(x: Inputs, compiled: bool) -> torch.Tensor:
    from coevo.config.optional import require

    chunked_loss = require("liger_kernel.chunked_loss", "the liger benchmark methods")
    LigerFusedLinearGRPOLoss = chunked_loss.LigerFusedLinearGRPOLoss

    loss_fn = LigerFusedLinearGRPOLoss(
        beta=BETA, compiled=compiled, use_ref_model=True, chunk_size=1, epsilon_low=EPS, epsilon_high=EPS,
        loss_type="dapo", temperature=TEMPERATURE,
    )  # fmt: skip
    shape = (x.b, x.t)
    loss, _metrics = loss_fn(
        x.hidden.view(x.b, x.t, -1),
        x.weight,
        x.targets.view(shape),
        torch.ones(shape, dtype=torch.long),
        x.seq_advantages,
        ref_per_token_logps=x.ref_logp.view(shape),
        old_per_token_logps=x.old_logp.view(shape),
    )
    return loss


def run_ours(x: Inputs) -> torch.Tensor:
    from coevo.kernels import grpo_loss

    return grpo_loss(
        x.hidden, x.weight, x.targets, x.old_logp, x.advantages, x.token_weights,
        ref_logp=x.ref_logp, temperature=TEMPERATURE, params=loss_params(), chunk_size=chunk_size(),
    ).loss  # fmt: skip


def run_ours_recompute(x: Inputs) -> torch.Tensor:
    from coevo.kernels.chunked import chunk_pass
    from coevo.kernels.rows_torch import torch_rows

    params, tokens = loss_params(), x.tokens()
    rows_per_tile = chunk_size()

    class Recompute(torch.autograd.Function):
        """Forward: loss only (no gradient GEMMs); backward: every tile's logits again, then the gradients."""

        @staticmethod
        def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(hidden, weight)
            terms = chunk_pass(hidden, weight, tokens, params, rows=torch_rows, chunk_size=rows_per_tile)
            return (x.token_weights * terms.loss).sum()

        @staticmethod
        def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            hidden, weight = ctx.saved_tensors
            grad_hidden, grad_weight = torch.empty_like(hidden), torch.empty_like(weight)
            chunk_pass(
                hidden, weight, tokens, params, rows=torch_rows, chunk_size=rows_per_tile,
                grad_hidden=grad_hidden, grad_weight=grad_weight,
            )  # fmt: skip
            return grad_hidden, grad_weight  # grad_loss is 1 here: loss.backward() on the scalar

    return Recompute.apply(x.hidden, x.weight)


def chunk_size() -> int:
    """Rows per tile for ours: --chunk-size, passed to the workers through the environment."""
    from coevo.kernels import DEFAULT_CHUNK_SIZE

    return int(os.environ.get("BENCH_LOSS_CHUNK_SIZE", DEFAULT_CHUNK_SIZE))


METHODS: dict[str, Callable[[Inputs], torch.Tensor]] = {
    "naive": run_naive,
    "trl": run_trl,
    "liger": lambda x: _liger(x, compiled=False),
    "liger-compiled": lambda x: _liger(x, compiled=True),
    "ours": run_ours,
    "ours-recompute": run_ours_recompute,
}


def _rss_kib(field: str) -> int:
    kib = status_kib(field)
    if kib is None:
        raise RuntimeError(f"{field} not in /proc/self/status")
    return kib


def fwd_bwd(method: Callable[[Inputs], torch.Tensor], x: Inputs) -> float:
    """One forward+backward, leaving the gradients in .grad; returns the loss."""
    x.hidden.grad = None
    x.weight.grad = None
    loss = method(x)
    loss.backward()
    return loss.item()


def worker(method_name: str, shape: tuple[int, int, int, int]) -> dict[str, Any]:
    """Measure one method once on one shape, in this process."""
    b, t, h, v = shape
    method = METHODS[method_name]
    start = time.perf_counter()
    fwd_bwd(method, make_inputs(b, t, 16, 512, seed=1))  # warm-up: same B, T; tiny H, V
    first_call = time.perf_counter() - start
    x = make_inputs(b, t, h, v)
    gc.collect()
    baseline_kib = _rss_kib("VmRSS")
    exact_peak = reset_high_water()
    if not exact_peak:
        baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    loss = fwd_bwd(method, x)
    seconds = time.perf_counter() - start
    peak_kib = _rss_kib("VmHWM") if exact_peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "peak_mib": (peak_kib - baseline_kib) / 1024, "loss": loss, "first_call": first_call}


def run_subprocess(method: str, shape_name: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", method, "--shapes", shape_name],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{method} on {shape_name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(shape_name: str, results: dict[str, list[dict[str, Any]]]) -> str:
    b, t, h, v = SHAPES[shape_name]
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in results.items()}
    base = med.get("naive")
    lines = [
        (
            f"B={b} T={t} (N={b * t}) H={h} V={v}, fp32, {len(next(iter(results.values())))} round(s); "
            "peak = RSS high-water mark above the inputs"
        ),
        "",
        "| method | time s (median) | min–max | × naive | peak MiB | × naive | first call s | loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, rs in results.items():
        times = [r["seconds"] for r in rs]
        ratio_t = f"{med[m]['seconds'] / base['seconds']:.2f}" if base else "–"
        ratio_m = f"{med[m]['peak_mib'] / base['peak_mib']:.2f}" if base else "–"
        lines.append(
            f"| {m} | {med[m]['seconds']:.3g} | {min(times):.3g}–{max(times):.3g} | {ratio_t} | "
            f"{med[m]['peak_mib']:.0f} | {ratio_m} | {med[m]['first_call']:.3g} | {med[m]['loss']:.6f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny shape, one round (smoke test)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--methods",
        help=f"comma-separated, from {list(METHODS)}; default {','.join(DEFAULT_METHODS)} "
        f"({','.join(QUICK_METHODS)} with --quick)",
    )
    ap.add_argument("--shapes", default="main,large", help=f"comma-separated, from {list(SHAPES)}")
    ap.add_argument("--chunk-size", type=int, help="rows per tile for ours (default: the library's)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        print(json.dumps(worker(args.worker, SHAPES[args.shapes])))
        return
    if args.chunk_size:
        os.environ["BENCH_LOSS_CHUNK_SIZE"] = str(args.chunk_size)
    shapes = ["quick"] if args.quick else args.shapes.split(",")
    rounds = 1 if args.quick else args.rounds
    methods = (args.methods or ",".join(QUICK_METHODS if args.quick else DEFAULT_METHODS)).split(",")
    unknown = [m for m in methods if m not in METHODS] + [s for s in shapes if s not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown method/shape: {unknown}")
    print(
        f"torch={torch.__version__} threads={torch.get_num_threads()} cpu_count={os.cpu_count()} "
        f"ours chunk_size={chunk_size()}"
    )
    for shape_name in shapes:
        results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
        for _ in range(rounds):
            for m in methods:
                results[m].append(run_subprocess(m, shape_name))
                print(f"  {shape_name} {m}: {results[m][-1]}", file=sys.stderr, flush=True)
        print()
        print(table(shape_name, results))


if __name__ == "__main__":
    main()
