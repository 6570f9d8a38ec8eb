"""The chunked path's GPU shape, checked where a CPU can: tile heights from the memory budget, every
GEMM in the inputs' dtype (no float32 copy of a tile), the weight gradient summed in float32, and
``auto``'s pick of the fastest candidate that fits."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from coevo.kernels import LossParams, grpo_loss
from coevo.kernels.chunked import DEFAULT_CHUNK_SIZE, TILE_ALIGN, mm_into, tile_rows
from coevo.kernels.select import fastest, reference_peak_bytes, shape_class

CUDA = torch.device("cuda")  # tile_rows only reads the device's type: no GPU needed


def test_a_cpu_keeps_its_measured_tile_and_a_gpu_fills_its_budget():
    assert tile_rows(8192, 151936, torch.float32, torch.device("cpu")) == DEFAULT_CHUNK_SIZE
    assert tile_rows(50, 151936, torch.float32, torch.device("cpu")) == 50
    # bf16 at V=151936: 512 MiB / (151936 x 2 B) = 1766 rows, rounded down to whole 64-row tiles
    rows = tile_rows(8192, 151936, torch.bfloat16, CUDA, workspace_mib=512)
    assert rows == 1728 and rows % TILE_ALIGN == 0 and rows * 151936 * 2 <= 512 * 2**20
    # the torch row kernel's float32 work copy counts: 2 + 4 bytes a value
    assert tile_rows(8192, 151936, torch.bfloat16, CUDA, workspace_mib=512, float32_work=True) == 576
    assert tile_rows(8192, 151936, torch.float32, CUDA, workspace_mib=512, float32_work=True) == 832  # no copy
    assert tile_rows(300, 151936, torch.bfloat16, CUDA) == 300  # never taller than the batch
    assert tile_rows(8192, 151936, torch.bfloat16, CUDA, workspace_mib=1) == TILE_ALIGN  # at least one tile row block
    with pytest.raises(ValueError, match="workspace_mib"):
        tile_rows(8, 100, torch.float32, CUDA, workspace_mib=0)


@pytest.mark.parametrize("accumulate", [False, True])
def test_mm_into_keeps_the_sum_wide_and_the_product_in_the_inputs_dtype(accumulate):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(40, 30, generator=g).bfloat16(), torch.randn(30, 20, generator=g).bfloat16()
    start = torch.randn(40, 20, generator=g)
    out = start.clone()
    mm_into(out, a, b, accumulate=accumulate)
    exact = a.double() @ b.double() + (start.double() if accumulate else 0)
    assert out.dtype == torch.float32
    assert float((out.double() - exact).abs().max()) <= 2**-8 * float(exact.abs().max())  # one bf16 rounding


class GemmDtypes(TorchDispatchMode):
    """The operand dtypes and shapes of every matrix product run inside it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
            mats = [a for a in args if isinstance(a, torch.Tensor) and a.dim() == 2][-2:]
            self.calls.append([(m.dtype, tuple(m.shape)) for m in mats])
        return func(*args, **(kwargs or {}))


def test_every_gemm_of_a_bf16_loss_runs_in_bf16():
    n, h, v = 40, 16, 600
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g).bfloat16().requires_grad_()
    weight = (torch.randn(v, h, generator=g) / h**0.5).bfloat16().requires_grad_()
    per_token = (torch.randint(0, v, (n,), generator=g), -torch.rand(n, generator=g) * 5 - 1,
                 torch.randn(n, generator=g), torch.full((n,), 1 / n))
    with GemmDtypes() as spy:
        out = grpo_loss(hidden, weight, *per_token, params=LossParams(), impl="chunked", chunk_size=16)
        out.loss.backward()
    assert len(spy.calls) == 3 * 3  # three chunks of three GEMMs: logits, dL/dh, dL/dW
    assert all(dtype == torch.bfloat16 for call in spy.calls for dtype, _ in call), spy.calls
    assert hidden.grad.dtype == weight.grad.dtype == torch.bfloat16


def test_auto_picks_the_fastest_candidate_that_ran():
    ms = {"triton": 12.0, "reference": 20.0, "chunked": 15.0}
    assert fastest(["triton", "reference", "chunked"], ms.get).impl == "triton"
    assert fastest(["triton", "reference"], {"triton": 25.0, "reference": 20.0}.get).impl == "reference"
    assert fastest(["triton", "reference"], {"triton": 20.0, "reference": 20.0}.get).impl == "triton"  # a tie: fused
    assert fastest(["triton", "reference"], {"triton": None, "reference": 20.0}.get).impl == "reference"
    choice = fastest(["triton", "reference"], lambda impl: None)  # nothing fit or ran: the fused path
    assert choice.impl == "triton" and choice.ms == {"triton": None, "reference": None}


def test_shape_classes_and_the_reference_footprint():
    w = torch.empty(151936, 896, dtype=torch.bfloat16)
    assert shape_class(torch.empty(8192, 896, dtype=torch.bfloat16), w).rows == 8192
    assert shape_class(torch.empty(5000, 896, dtype=torch.bfloat16), w).rows == 8192
    assert shape_class(torch.empty(1, 896, dtype=torch.bfloat16), w).rows == 1
    assert shape_class(torch.empty(5000, 896, dtype=torch.bfloat16), w).dtype == "bfloat16"
    # 8192 x 151936 bf16 logits (2.3 GiB) and three float32 tensors of that size: 16.2 GiB
    assert reference_peak_bytes(8192, 151936, torch.bfloat16) == 8192 * 151936 * 14
