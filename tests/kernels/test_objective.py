"""The per-token objective (``kernels/objective.py``) against a scalar twin, for every VARIANTS entry.

Every loss path computes ℓ through ``token_loss`` (or, in Triton, a copy of it that
test_grpo_loss holds to the float64 reference), so the definition itself is checked here against
an independent one: the formulas in plain Python floats, differentiated by central differences in
float64. Log-ratios sit ≥ 4 % away from every kink (clip edges 0.8 / 1.2, dual-clip edge 3), where
ℓ is smooth and a difference quotient with h = 1e-6 is accurate to ~1e-9.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from coevo.kernels.objective import VARIANTS, LossParams, token_loss

RATIOS = (0.5, 0.95, 1.05, 2.0, 5.0)
EPS_LOW, EPS_HIGH, DUAL, BETA = 0.2, 0.2, 3.0, 0.3


def twin(logp: float, old: float, adv: float, ref: float, clip: str, kl: str) -> tuple[float, float, bool]:
    """(ℓ, the KL estimate, clipped) of one token, written from the papers' formulas."""
    r = math.exp(logp - old)
    surrogate = max(-r * adv, -min(max(r, 1 - EPS_LOW), 1 + EPS_HIGH) * adv)
    clipped = (adv > 0 and r > 1 + EPS_HIGH) or (adv < 0 and r < 1 - EPS_LOW)
    if clip == "dual" and adv < 0 and surrogate > -DUAL * adv:
        surrogate, clipped = -DUAL * adv, True
    x = logp - ref  # log π/π_ref
    estimate = {"k1": x, "k2": x * x / 2, "k3": math.exp(-x) + x - 1}[kl]
    return surrogate + BETA * estimate, estimate, clipped


def tokens() -> tuple[torch.Tensor, ...]:
    """[n] float64 logp, old_logp, advantages, ref_logp: every ratio with both advantage signs."""
    g = torch.Generator().manual_seed(0)
    pairs = list(itertools.product(RATIOS, (0.7, -0.7)))
    logp = -1 - 3 * torch.rand(len(pairs), generator=g, dtype=torch.float64)
    old = logp - torch.tensor([math.log(r) for r, _ in pairs], dtype=torch.float64)
    adv = torch.tensor([a for _, a in pairs], dtype=torch.float64)
    ref = logp + 0.5 * torch.randn(len(pairs), generator=g, dtype=torch.float64)
    return logp, old, adv, ref


@pytest.mark.parametrize(("clip", "kl"), list(itertools.product(VARIANTS["clip"], VARIANTS["kl"])))
def test_every_variant_matches_its_scalar_twin_and_its_own_derivative(clip: str, kl: str) -> None:
    params = LossParams(EPS_LOW, EPS_HIGH, DUAL if clip == "dual" else None, BETA, kl)
    assert params.clip == clip
    logp, old, adv, ref = tokens()
    x = logp.clone().requires_grad_()
    terms = token_loss(x, old, adv, ref, params)
    (autograd_slope,) = torch.autograd.grad(terms.loss.sum(), x)
    h = 1e-6
    for i in range(len(logp)):
        args = (old[i].item(), adv[i].item(), ref[i].item(), clip, kl)
        loss, estimate, clipped = twin(logp[i].item(), *args)
        numeric = (twin(logp[i].item() + h, *args)[0] - twin(logp[i].item() - h, *args)[0]) / (2 * h)
        assert terms.loss[i].item() == pytest.approx(loss, rel=1e-12, abs=1e-12)
        assert terms.kl[i].item() == pytest.approx(estimate, rel=1e-12, abs=1e-12)
        assert bool(terms.clipped[i]) == clipped
        assert terms.dloss_dlogp[i].item() == pytest.approx(numeric, rel=1e-6, abs=1e-8), (i, "written out")
        assert autograd_slope[i].item() == pytest.approx(numeric, rel=1e-6, abs=1e-8), (i, "autograd")
    assert terms.clipped.any() and not terms.clipped.all()


def test_beta_zero_reports_the_kl_without_adding_it() -> None:
    logp, old, adv, ref = tokens()
    with_kl = token_loss(logp, old, adv, ref, LossParams(beta=0.0, kl_estimator="k2"))
    without = token_loss(logp, old, adv, None, LossParams())
    assert torch.equal(with_kl.loss, without.loss) and torch.equal(with_kl.dloss_dlogp, without.dloss_dlogp)
    assert without.kl is None and torch.equal(with_kl.kl, 0.5 * (logp - ref) ** 2)


def test_the_written_out_slope_survives_an_overflowing_ratio() -> None:
    """A token scored far above its behaviour log-prob (e.g. sampled at a low temperature, then the
    policy moved) overflows r = exp(logp − old) in float32. Where the clip holds it, the slope must be
    0 — not 0 · inf = nan, which is what differentiating the value would give and would poison the step."""
    logp = torch.tensor([-0.5, -0.5])
    old = torch.tensor([-200.0, -200.0])
    adv = torch.tensor([1.0, -1.0])
    terms = token_loss(logp, old, adv, None, LossParams(eps_high=0.28, dual_clip=3.0))
    assert torch.isinf(terms.ratio).all() and terms.clipped.all()
    assert terms.dloss_dlogp.tolist() == [0.0, 0.0]
    assert terms.loss.tolist() == pytest.approx([-1.28, 3.0])


def test_the_objectives_defaults_are_the_trainers():
    """kernels/ states the objective's usual settings itself (it imports nothing of the config);
    ``trainer.*`` starts from the same ones."""
    from dataclasses import fields

    from coevo.config.schema import TrainerConfig

    defaults = LossParams()
    assert fields(LossParams)
    for f in fields(LossParams):
        assert getattr(defaults, f.name) == getattr(TrainerConfig(), f.name), f.name
