"""Every GRPO loss path against the float64 reference: loss, gradients and the detached outputs.

Ground truth is ``grpo_loss_reference`` in float64 on the very same (already rounded) inputs, so a
test measures only the path's own arithmetic. Ratios are placed on purpose (r ∈ {0.5, 0.95, 1.05,
2, 5}, i.e. ≥ 4 % away from the clip edges 0.8 / 1.2 and the dual-clip edge 3): a rounding error can
then never flip whether a token is clipped, which would change its gradient discontinuously.

Tolerances, as max |error| over max |reference| of each tensor (elementwise relative error is
meaningless for gradients with entries near zero); for the loss and the per-token values the scale
is at least 1, so a loss or KL near 0 is held to an absolute error:
- float32: 2e-5 for the loss and the per-token values, 2e-4 for gradients. float32 rounds at 6e-8
  per operation; the logits sum H products, the normaliser V exponentials and the gradient GEMMs V
  (grad_hidden) or N (grad_weight) terms. Observed: ≤ 2e-6 for values, ≤ 1e-5 for gradients except
  grad_hidden at V=151936 split into ≤ 3-row chunks, 4.2e-5: BLAS sums the 151936 products of such a
  skinny GEMM with less blocking (one 5-row chunk gives 2.6e-6; the float32 reference 6.8e-6).
  A real mistake — a wrong sign, a missing 1/T, a missed clip — is an O(1) error.
- bfloat16 (unit roundoff 2e-3): the GEMM output is rounded to bf16 before the softmax; with |z| up
  to ~10 here that is ~2e-2 on logp and on everything derived from it: 5e-2 for values and gradients.
  Observed: ≤ 1.9e-2 (the bf16 reference's KL), ≤ 1.5e-2 for gradients.

The Triton cases run in-process where Triton can (CUDA, or an interpreter-mode process) and are
otherwise skipped; ``test_triton_cases_under_interpreter`` reruns exactly those cases in a subprocess
with TRITON_INTERPRET=1, so this process (and the rest of the suite) never sees the variable.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from coevo.kernels import LossParams, auto_impl, grpo_loss
from coevo.kernels.triton_grpo import INTERPRETED, TRITON_AVAILABLE, triton_usable

# ratio = exp(offset): 0.5, 0.95, 1.05, 2, 5 — far from the edges 0.8, 1.2 (and the dual clip at 3)
STALE_OFFSETS = (math.log(0.5), math.log(0.95), math.log(1.05), math.log(2.0), math.log(5.0))
TOL = {torch.float32: {"value": 2e-5, "grad": 2e-4}, torch.bfloat16: {"value": 5e-2, "grad": 5e-2}}
IMPLS = ("reference", "chunked", "triton")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class Case:
    """Inputs of one test, hidden/weight in float64 but already rounded to the dtype under test."""

    hidden: torch.Tensor  # [N, H] float64
    weight: torch.Tensor  # [V, H] float64
    targets: torch.Tensor  # [N] int64
    old_logp: torch.Tensor  # [N] float32
    advantages: torch.Tensor  # [N] float32
    token_weights: torch.Tensor  # [N] float32, every 5th token 0
    ref_logp: torch.Tensor | None  # [N] float32
    dtype: torch.dtype

    @property
    def n(self) -> int:
        return self.hidden.shape[0]


def make_case(
    n: int = 37,
    h: int = 24,
    v: int = 1031,
    *,
    dtype: torch.dtype = torch.float32,
    temperature: float | torch.Tensor = 1.0,  # or [N]: each row's own
    with_ref: bool = False,
    on_policy: bool = False,
    seed: int = 0,
) -> Case:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64).to(dtype).double()
    weight = (torch.randn(v, h, generator=g, dtype=torch.float64) * 2 / math.sqrt(h)).to(dtype).double()
    targets = torch.randint(0, v, (n,), generator=g)
    t = temperature.double()[:, None] if isinstance(temperature, torch.Tensor) else temperature  # [N, 1] or a float
    logp = torch.log_softmax(hidden @ weight.T / t, -1).gather(-1, targets[:, None]).squeeze(-1)  # [N]
    offsets = torch.tensor([0.0 if on_policy else STALE_OFFSETS[i % len(STALE_OFFSETS)] for i in range(n)])
    signs = torch.tensor([1.0 if (i // len(STALE_OFFSETS)) % 2 == 0 else -1.0 for i in range(n)])
    advantages = signs * (0.1 + torch.rand(n, generator=g, dtype=torch.float64))  # |A| ≥ 0.1, both signs
    token_weights = torch.rand(n, generator=g, dtype=torch.float64) / n
    token_weights[::5] = 0.0
    ref_logp = (logp + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)).float() if with_ref else None
    return Case(
        hidden, weight, targets, (logp - offsets).float(), advantages.float(), token_weights.float(), ref_logp, dtype
    )


@dataclass
class Result:
    out: object  # GRPOLossOutput
    grad_hidden: torch.Tensor  # [N, H] float64
    grad_weight: torch.Tensor  # [V, H] float64


def run(
    case: Case,
    impl: str,
    *,
    float64: bool = False,
    temperature: float | torch.Tensor = 1.0,
    chunk_size: int | None = None,
    **params: object,
) -> Result:
    """One forward+backward of ``impl`` on the case, in the case's dtype (or float64: the ground truth);
    ``params`` are LossParams fields."""
    dtype = torch.float64 if float64 else case.dtype
    device = DEVICE if impl == "triton" else torch.device("cpu")
    hidden = case.hidden.detach().to(device, dtype).requires_grad_()  # detach: never mark the case's own tensor
    weight = case.weight.detach().to(device, dtype).requires_grad_()
    per_token = [t.to(device) for t in (case.targets, case.old_logp, case.advantages, case.token_weights)]
    ref = case.ref_logp.to(device) if case.ref_logp is not None else None
    chunk = {} if chunk_size is None else {"chunk_size": chunk_size}
    out = grpo_loss(hidden, weight, *per_token, ref_logp=ref, temperature=temperature,
                    params=LossParams(**params), impl=impl, **chunk)  # type: ignore[arg-type]
    out.loss.backward()
    return Result(out, hidden.grad.double().cpu(), weight.grad.double().cpu())


def truth(case: Case, **kwargs: object) -> Result:
    return run(case, "reference", float64=True, **kwargs)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str, floor: float = 1e-12) -> None:
    """max |actual − expected| ≤ tol · max(max |expected|, floor)."""
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    scale = max(float(expected.abs().max()) if expected.numel() else 0.0, floor)
    err = float((actual - expected).abs().max()) if expected.numel() else 0.0
    assert err <= tol * scale, f"{what}: max error {err:.3g} > {tol:g} × {scale:.3g}"


def assert_matches(got: Result, want: Result, dtype: torch.dtype) -> None:
    tol = TOL[dtype]
    for name in ("loss", "logp", "ratio") + (("kl",) if want.out.kl is not None else ()):
        assert_close(getattr(got.out, name), getattr(want.out, name), tol["value"], name, floor=1.0)
    assert torch.equal(got.out.clipped.cpu(), want.out.clipped), "clipped flags differ"
    assert (got.out.kl is None) == (want.out.kl is None)
    assert_close(got.grad_hidden, want.grad_hidden, tol["grad"], "grad hidden")
    assert_close(got.grad_weight, want.grad_weight, tol["grad"], "grad weight")
    for name in ("logp", "ratio", "clipped") + (("kl",) if want.out.kl is not None else ()):
        assert not getattr(got.out, name).requires_grad, f"{name} must be detached"


def need(impl: str) -> None:
    if impl == "triton" and not triton_usable(DEVICE):
        pytest.skip("Triton runs on CUDA or under TRITON_INTERPRET=1 (see test_triton_cases_under_interpreter)")


CONFIGS = {
    "plain": {},
    "kl": {"with_ref": True, "beta": 0.1},
    "kl-logged-only": {"with_ref": True, "beta": 0.0},
    "kl-k1": {"with_ref": True, "beta": 0.1, "kl_estimator": "k1"},
    "kl-k2": {"with_ref": True, "beta": 0.1, "kl_estimator": "k2"},
    "dual-clip": {"dual_clip": 3.0},
    "temperature": {"temperature": 0.7},
    "asymmetric-all": {"with_ref": True, "beta": 0.05, "dual_clip": 3.0, "temperature": 0.7, "eps_high": 0.28},
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("impl", IMPLS)
def test_matches_float64_reference(impl: str, config: str) -> None:
    need(impl)
    kw = dict(CONFIGS[config])
    case = make_case(with_ref=kw.pop("with_ref", False), temperature=kw.get("temperature", 1.0))
    chunk = {} if impl == "reference" else {"chunk_size": 10}  # 10 does not divide N=37
    assert_matches(run(case, impl, **kw, **chunk), truth(case, **kw), torch.float32)


@pytest.mark.parametrize("chunk_size", [1, 7, 36, 37, 64])
@pytest.mark.parametrize("impl", ["chunked", "triton"])
def test_any_chunk_size(impl: str, chunk_size: int) -> None:
    need(impl)
    case = make_case(with_ref=True)
    kw = {"beta": 0.1, "dual_clip": 3.0}
    assert_matches(run(case, impl, chunk_size=chunk_size, **kw), truth(case, **kw), torch.float32)


@pytest.mark.parametrize("impl", ["chunked", "triton"])
def test_real_vocabulary(impl: str) -> None:
    need(impl)
    case = make_case(n=5, h=16, v=151936, with_ref=True, temperature=0.7)
    kw = {"beta": 0.1, "temperature": 0.7, "dual_clip": 3.0}
    assert_matches(run(case, impl, chunk_size=2, **kw), truth(case, **kw), torch.float32)


@pytest.mark.parametrize("impl", IMPLS)
def test_bfloat16(impl: str) -> None:
    need(impl)
    case = make_case(n=19, h=16, v=300, dtype=torch.bfloat16, with_ref=True, temperature=0.7)
    kw = {"beta": 0.1, "temperature": 0.7, "dual_clip": 3.0}
    got = run(case, impl, **kw, **({} if impl == "reference" else {"chunk_size": 8}))
    assert got.out.loss.dtype == torch.float32 and got.out.logp.dtype == torch.float32
    assert_matches(got, truth(case, **kw), torch.bfloat16)


@pytest.mark.parametrize("impl", IMPLS)
def test_on_policy_is_the_policy_gradient(impl: str) -> None:
    """old_logp = logp: ratio 1, nothing clipped, gradient = ∇(−Σ w·A·logp)."""
    need(impl)
    case = make_case(on_policy=True, temperature=0.7)
    got = run(case, impl, temperature=0.7)
    assert_close(got.out.ratio, torch.ones(case.n), 1e-5, "ratio")
    assert not got.out.clipped.any()

    hidden = case.hidden.clone().requires_grad_()
    weight = case.weight.clone().requires_grad_()
    logp = torch.log_softmax(hidden @ weight.T / 0.7, -1).gather(-1, case.targets[:, None]).squeeze(-1)  # [N]
    (-(case.token_weights.double() * case.advantages.double() * logp).sum()).backward()
    assert_close(got.grad_hidden, hidden.grad, TOL[torch.float32]["grad"], "grad hidden")
    assert_close(got.grad_weight, weight.grad, TOL[torch.float32]["grad"], "grad weight")


@pytest.mark.parametrize("impl", IMPLS)
def test_forced_tokens_are_rated_against_the_current_policy(impl: str) -> None:
    """A nan behaviour log-prob (a token the harness forced, ``credit_forced``): ratio 1, never
    clipped, gradient −w·A·∇logp on it, while the sampled tokens keep their stale, clipped
    surrogate: the whole batch equals the reference with old_logp = logp on the forced rows."""
    need(impl)
    case = make_case(n=40, with_ref=True)
    forced = torch.arange(case.n) % 3 == 0  # [N]
    marked = replace(case, old_logp=torch.where(forced, torch.full_like(case.old_logp, float("nan")), case.old_logp))
    kw = {"beta": 0.1, "dual_clip": 3.0, "eps_high": 0.28}
    got = run(marked, impl, **kw)
    assert_close(got.out.ratio[forced.to(got.out.ratio.device)].cpu(), torch.ones(int(forced.sum())), 1e-5, "ratio")
    assert not got.out.clipped.cpu()[forced].any()
    assert torch.isfinite(got.grad_weight).all() and torch.isfinite(got.out.loss.detach().cpu()).all()
    logp = truth(case, **kw).out.logp.float()  # [N] the current policy's
    want = truth(replace(case, old_logp=torch.where(forced, logp, case.old_logp)), **kw)
    assert_matches(got, want, torch.float32)
    assert_close(got.grad_weight, want.grad_weight, TOL[torch.float32]["grad"], "grad weight")


def mixed_temperatures(n: int) -> torch.Tensor:
    """[N] float32: the calls of one batch sampled at different temperatures (a temperature schedule)."""
    return torch.tensor([(0.3, 0.7, 1.0, 1.3)[i % 4] for i in range(n)], dtype=torch.float32)


@pytest.mark.parametrize("impl", IMPLS)
def test_mixed_temperatures_match_float64_reference(impl: str) -> None:
    need(impl)
    case = make_case(with_ref=True, temperature=mixed_temperatures(37))
    device = DEVICE if impl == "triton" else torch.device("cpu")
    kw = {"beta": 0.1, "dual_clip": 3.0, "eps_high": 0.28}
    got = run(case, impl, temperature=mixed_temperatures(37).to(device), **kw,
              **({} if impl == "reference" else {"chunk_size": 10}))
    assert_matches(got, truth(case, temperature=mixed_temperatures(37), **kw), torch.float32)


def test_per_row_temperatures_equal_one_scalar_temperature_per_group() -> None:
    """The float64 reference with per-row temperatures is the sum of scalar-temperature references
    over the rows of each temperature: loss, per-token values and gradients."""
    temps = mixed_temperatures(37)
    case = make_case(with_ref=True, temperature=temps)
    kw = {"beta": 0.1, "dual_clip": 3.0}
    mixed = truth(case, temperature=temps, **kw)
    loss = torch.zeros((), dtype=torch.float64)
    grad_hidden = torch.zeros_like(mixed.grad_hidden)
    grad_weight = torch.zeros_like(mixed.grad_weight)
    for t in sorted(set(temps.tolist())):
        rows = temps == t
        part = Case(case.hidden[rows], case.weight, case.targets[rows], case.old_logp[rows], case.advantages[rows],
                    case.token_weights[rows], case.ref_logp[rows], case.dtype)
        got = truth(part, temperature=t, **kw)
        loss += got.out.loss
        grad_hidden[rows] = got.grad_hidden
        grad_weight += got.grad_weight
        for name in ("logp", "ratio", "kl"):
            assert_close(getattr(mixed.out, name)[rows], getattr(got.out, name), 1e-12, name, floor=1.0)
    assert_close(mixed.out.loss, loss, 1e-12, "loss", floor=1.0)
    assert_close(mixed.grad_hidden, grad_hidden, 1e-12, "grad hidden")
    assert_close(mixed.grad_weight, grad_weight, 1e-12, "grad weight")


@pytest.mark.parametrize("impl", IMPLS)
def test_on_policy_at_mixed_temperatures_has_ratio_one(impl: str) -> None:
    """Each token scored at the temperature that sampled it: ratio 1 on-policy, also when rows differ."""
    need(impl)
    temps = mixed_temperatures(37)
    case = make_case(on_policy=True, temperature=temps)
    device = DEVICE if impl == "triton" else torch.device("cpu")
    got = run(case, impl, temperature=temps.to(device))
    assert_close(got.out.ratio, torch.ones(case.n), 1e-5, "ratio")
    assert not got.out.clipped.any()


@pytest.mark.parametrize("impl", IMPLS)
def test_stale_tokens_clip_and_lose_their_gradient(impl: str) -> None:
    need(impl)
    case = make_case(n=40)
    clipped = run(case, impl, dual_clip=3.0).out.clipped.cpu()
    assert 0 < clipped.float().mean() < 1
    # A > 0 with r ∈ {2, 5} and A < 0 with r = 0.5 hit the ratio clip; A < 0 with r = 5 the dual clip.
    r = torch.exp(torch.tensor(STALE_OFFSETS)).repeat(8)[: case.n]
    a = case.advantages
    expected = ((a > 0) & (r > 1.2)) | ((a < 0) & (r < 0.8)) | ((a < 0) & (r > 3.0))
    assert torch.equal(clipped, expected)
    # Only the clipped tokens weighted: no gradient at all. Only the others: some.
    only_clipped = replace(case, token_weights=case.token_weights * clipped)
    silent = run(only_clipped, impl, dual_clip=3.0)
    assert silent.out.loss != 0
    assert silent.grad_hidden.abs().max() == 0 and silent.grad_weight.abs().max() == 0
    only_free = replace(case, token_weights=case.token_weights * ~clipped)
    assert run(only_free, impl, dual_clip=3.0).grad_weight.abs().max() > 0


@pytest.mark.parametrize("impl", ["chunked", "triton"])
def test_zero_weight_tokens_contribute_nothing(impl: str) -> None:
    need(impl)
    case = make_case(with_ref=True)
    kw = {"beta": 0.1, "chunk_size": 8}
    full = run(case, impl, **kw)
    keep = case.token_weights > 0
    subset = Case(
        case.hidden[keep], case.weight, case.targets[keep], case.old_logp[keep], case.advantages[keep],
        case.token_weights[keep], case.ref_logp[keep], case.dtype,
    )  # fmt: skip
    part = run(subset, impl, **kw)
    assert full.grad_hidden[~keep].abs().max() == 0
    assert_close(full.grad_weight, part.grad_weight, 1e-6, "grad weight")
    assert_close(full.out.loss, part.out.loss, 1e-6, "loss")


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_batch(impl: str) -> None:
    need(impl)
    case = make_case(n=0)
    got = run(case, impl)
    assert got.out.loss.item() == 0.0
    assert got.grad_hidden.shape == (0, 24) and got.grad_weight.abs().max() == 0


def test_grad_output_scales_and_retain_graph_accumulates() -> None:
    case = make_case()
    want = truth(case)
    hidden = case.hidden.float().requires_grad_()
    weight = case.weight.float().requires_grad_()
    per_token = (case.targets, case.old_logp, case.advantages, case.token_weights)
    out = grpo_loss(hidden, weight, *per_token, impl="chunked")
    (3 * out.loss).backward(retain_graph=True)
    out.loss.backward()
    assert_close(hidden.grad, 4 * want.grad_hidden, TOL[torch.float32]["grad"], "grad hidden")
    assert_close(weight.grad, 4 * want.grad_weight, TOL[torch.float32]["grad"], "grad weight")


def test_frozen_head_and_no_grad() -> None:
    case = make_case()
    hidden = case.hidden.float().requires_grad_()
    weight = case.weight.float()  # frozen LM head: no weight gradient is formed
    per_token = (case.targets, case.old_logp, case.advantages, case.token_weights)
    out = grpo_loss(hidden, weight, *per_token, impl="chunked")
    out.loss.backward()
    assert weight.grad is None
    assert_close(hidden.grad, truth(case).grad_hidden, TOL[torch.float32]["grad"], "grad hidden")
    with torch.no_grad():
        evaluated = grpo_loss(case.hidden.float().requires_grad_(), weight, *per_token, impl="chunked")
    assert not evaluated.loss.requires_grad
    assert_close(evaluated.loss, out.loss, 1e-7, "loss")


def test_dispatch_and_validation() -> None:
    case = make_case(n=4, h=8, v=50)
    hidden, weight = case.hidden.float(), case.weight.float()
    assert auto_impl(hidden, weight, LossParams()) == "chunked"  # on a CPU: nothing to measure
    per_token = (case.targets, case.old_logp, case.advantages, case.token_weights)
    with pytest.raises(ValueError, match="impl"):
        grpo_loss(hidden, weight, *per_token, impl="fast")
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(hidden, weight, *per_token, params=LossParams(beta=0.1))
    with pytest.raises(ValueError, match="dual_clip"):
        LossParams(dual_clip=0.9)
    with pytest.raises(ValueError, match="kl must be one of"):
        LossParams(kl_estimator="k4")
    with pytest.raises(ValueError, match="temperature"):
        grpo_loss(hidden, weight, *per_token, temperature=0.0)
    with pytest.raises(ValueError, match="temperature"):
        grpo_loss(hidden, weight, *per_token, temperature=torch.tensor([0.7, 0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="temperature"):
        grpo_loss(hidden, weight, *per_token, temperature=torch.ones(3))
    with pytest.raises(ValueError, match="targets"):
        grpo_loss(hidden, weight, case.targets + 50, *per_token[1:])
    with pytest.raises(ValueError, match="shape"):
        grpo_loss(hidden, weight, *per_token[:3], case.token_weights[:3])
    with pytest.raises(ValueError, match="dtype"):
        grpo_loss(hidden.double(), weight, *per_token)
    with pytest.raises(ValueError, match="chunk_size"):
        grpo_loss(hidden, weight, *per_token, chunk_size=0)
    if TRITON_AVAILABLE and not triton_usable(torch.device("cpu")):
        with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
            grpo_loss(hidden, weight, *per_token, impl="triton")


@pytest.mark.skipif(not TRITON_AVAILABLE, reason="triton is not installed")
@pytest.mark.skipif(INTERPRETED, reason="already the interpreter process")
def test_triton_cases_under_interpreter() -> None:
    """The [triton] cases above, in a child pytest with TRITON_INTERPRET=1 (triton reads it at import)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "-k", "triton and not interpreter"],
        cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "passed" in summary and "skipped" not in summary, summary
