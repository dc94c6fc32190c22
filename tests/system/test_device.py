"""dreamer/system/device.py and rank_device: CUDA choices that a user can get wrong are one line."""

from __future__ import annotations

import pytest
import torch

from dreamer.errors import UserError
from dreamer.system.device import configure_cuda_math, resolve_autocast, resolve_device
from dreamer.system.distributed import Ranks, rank_device
from tests.support.gpu_checks import COMPILED_UPDATES_CUDA, CUDA_MISTAKES


@pytest.mark.gpu_acceptance(CUDA_MISTAKES)
def test_cuda_on_a_cpu_only_torch_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(UserError, match=r"device=cuda but this torch .* is a CPU-only build: install the CUDA"):
        resolve_device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.gpu_acceptance(CUDA_MISTAKES)
def test_cuda_without_a_visible_gpu_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="no CUDA device is visible"):
        resolve_device("cuda:0")
    assert resolve_device("auto") == torch.device("cpu")


@pytest.mark.gpu_acceptance(CUDA_MISTAKES)
def test_a_cuda_index_past_the_last_gpu_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(UserError, match=r"only 2 CUDA device\(s\) are visible: use cuda:0..cuda:1"):
        resolve_device("cuda:2")


@pytest.mark.gpu_acceptance(CUDA_MISTAKES)
def test_auto_autocast_never_picks_emulated_bf16(monkeypatch):
    # A V100 or T4: bf16 "supported" only through emulation, slower than fp32.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert resolve_autocast("auto", torch.device("cuda")) is None
    # An A100/H100: native bf16.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert resolve_autocast("auto", torch.device("cuda")) is torch.bfloat16
    assert resolve_autocast("auto", torch.device("cpu")) is None
    assert resolve_autocast("bf16", torch.device("cpu")) is torch.bfloat16
    assert resolve_autocast("off", torch.device("cuda")) is None


def test_cuda_math_settings_touch_nothing_on_cpu():
    before = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32)
    assert configure_cuda_math(torch.device("cpu"), fast=True) == "off (not CUDA)"
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32) == before


@pytest.mark.gpu_acceptance(CUDA_MISTAKES)
def test_cuda_math_settings_on_cuda_and_the_key_that_turns_them_off():
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32)
    try:
        assert configure_cuda_math(torch.device("cuda"), fast=True) == "tf32+cudnn.benchmark"
        assert torch.backends.cudnn.benchmark and torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "high"
        assert configure_cuda_math(torch.device("cuda"), fast=False) == "off"
        assert not torch.backends.cudnn.benchmark and not torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.gpu_acceptance(CUDA_MISTAKES)
def test_a_fixed_gpu_index_under_torchrun_is_refused():
    ranks = Ranks(rank=1, world_size=2, local_rank=1, local_world_size=2)
    assert rank_device(torch.device("cuda"), ranks) == torch.device("cuda", 1)
    with pytest.raises(UserError, match="would put every rank on one GPU: set device=cuda"):
        rank_device(torch.device("cuda", 0), ranks)
    assert rank_device(torch.device("cuda", 3), Ranks()) == torch.device("cuda", 3)  # one process: as asked


# -- on a GPU ----------------------------------------------------------------------


@pytest.mark.cuda(COMPILED_UPDATES_CUDA)
@pytest.mark.parametrize("pixels", [False, True], ids=["states", "pixels"])
@pytest.mark.parametrize("algo", ["dreamer_v1", "dreamer_v3", "dreamer_v3_reinforce"])
def test_compiled_updates_on_cuda_never_sync_and_never_trace_again(algo, pixels):
    """Compiled (inductor) V1 and V3 updates under the autocast ``auto`` picks (bf16
    where the GPU runs it natively): after warm-up, updates make no host sync
    (sync-debug mode "error" raises on one) and trace no graph again. V3 with
    REINFORCE imagines without recording autograd (ScoreFunctionDreamerEnv)."""
    from torch._dynamo.utils import counters

    from dreamer.config import validate
    from tests.support.configs import tiny_config
    from tests.support.learners import learner_on

    cfg = tiny_config(pixels=pixels, algo=algo.removesuffix("_reinforce"))
    if algo.endswith("_reinforce"):
        cfg.algo.actor_grad = "reinforce"
    cfg.compile.enabled, cfg.compile.backend, cfg.compile.warmup_iters = True, "inductor", 1
    cfg = validate(cfg)
    device = torch.device("cuda")
    learner, batch = learner_on(cfg, device, autocast_dtype=resolve_autocast("auto", device))
    learner.compile()
    learner.warmup(batch.clone())
    learner.update(batch.clone())  # optimiser state exists from here on
    traced = counters["stats"]["unique_graphs"]
    samples = [batch.clone() for _ in range(3)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for sample in samples:
            learner.update(sample)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert counters["stats"]["unique_graphs"] == traced, "an update traced a compiled loss again"
    metrics = learner.flush_metrics()
    assert metrics["updates_skipped_nonfinite"] == 0
