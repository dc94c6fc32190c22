"""dreamer/data/transforms.py (PixelPreprocess, VectorAsImage) and envs.DownsampleUInt8."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict

from dreamer.data.transforms import PixelPreprocess, VectorAsImage
from dreamer.envs.wrappers import DownsampleUInt8
from tests.support.gpu_checks import TRANSFORMS_CUDA


def reference_preprocess(frames: torch.Tensor, size: int, grayscale: bool) -> torch.Tensor:
    """Independent float64 reference: HWC->CHW, /255, BT.601 luma, bilinear+antialias, -0.5."""
    lead = frames.shape[:-3]
    x = frames.reshape(-1, *frames.shape[-3:]).to(torch.float64).permute(0, 3, 1, 2) / 255.0
    if grayscale:
        r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
        x = 0.2989 * r + 0.587 * g + 0.114 * b
    if x.shape[-1] != size or x.shape[-2] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    x = x - 0.5
    return x.reshape(*lead, *x.shape[1:]).to(torch.float32)


def _frames(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("grayscale", [False, True])
@pytest.mark.parametrize("input_size", [64, 96])
def test_pixel_preprocess_matches_reference(input_size, grayscale):
    frames = _frames(2, 3, input_size, input_size, 3)
    pre = PixelPreprocess(64, grayscale=grayscale)
    out = pre(frames)
    channels = 1 if grayscale else 3
    assert pre.out_channels == channels
    assert out.dtype == torch.float32
    assert out.shape == (2, 3, channels, 64, 64)
    assert out.min() >= -0.5 and out.max() <= 0.5
    torch.testing.assert_close(out, reference_preprocess(frames, 64, grayscale), atol=2e-5, rtol=0)


def test_pixel_preprocess_extremes_map_to_half_range():
    frames = torch.zeros(1, 64, 64, 3, dtype=torch.uint8)
    frames[..., 32:, :, :] = 255
    out = PixelPreprocess(64)(frames)
    assert torch.all(out[:, :, :32] == -0.5)
    assert torch.all(out[:, :, 32:] == 0.5)


def test_pixel_preprocess_does_not_modify_its_input():
    frames = _frames(4, 64, 64, 3)
    before = frames.clone()
    PixelPreprocess(64, grayscale=True)(frames)
    assert torch.equal(frames, before)


def test_grayscale_of_grey_image_is_that_grey():
    # BT.601 weights sum to ~1: a grey pixel keeps (almost exactly) its value.
    frames = torch.full((1, 1, 64, 64, 3), 200, dtype=torch.uint8)
    out = PixelPreprocess(64, grayscale=True)(frames)
    torch.testing.assert_close(out, torch.full_like(out, 200 / 255 - 0.5), atol=1e-3, rtol=0)


@pytest.mark.cuda(TRANSFORMS_CUDA)
@pytest.mark.parametrize("grayscale", [False, True])
@pytest.mark.parametrize("input_size", [64, 96])
def test_pixel_preprocess_cuda_matches_cpu(input_size, grayscale):
    frames = _frames(2, 5, input_size, input_size, 3)
    pre = PixelPreprocess(64, grayscale=grayscale)
    cpu = pre(frames)
    cuda = pre.to("cuda")(frames.to("cuda"))
    assert cuda.device.type == "cuda" and cuda.dtype == torch.float32
    torch.testing.assert_close(cuda.cpu(), cpu, atol=1e-5, rtol=0)


def test_vector_as_image_adds_two_singleton_dims():
    x = torch.randn(2, 5, 3)
    y = VectorAsImage()(x)
    assert y.shape == (2, 5, 1, 1, 3)
    assert torch.equal(y.flatten(-3), x)


# -- DownsampleUInt8 -------------------------------------------------------------


def _downsample(frames: torch.Tensor, size: int) -> torch.Tensor:
    td = TensorDict({"pixels": frames}, batch_size=frames.shape[:-3])
    return DownsampleUInt8(size)(td)["pixels"]


@pytest.mark.parametrize("lead", [(), (4,), (2, 3)])
def test_downsample_uint8_shape_and_dtype(lead):
    frames = _frames(*lead, 500, 500, 3)
    out = _downsample(frames, 64)
    assert out.dtype == torch.uint8
    assert out.shape == (*lead, 64, 64, 3)


def test_downsample_uint8_constant_image_stays_constant():
    frames = torch.full((2, 210, 160, 3), 0, dtype=torch.uint8)
    frames[..., 0] = 17
    frames[..., 1] = 128
    frames[..., 2] = 255
    out = _downsample(frames, 64)
    assert torch.all(out[..., 0] == 17)
    assert torch.all(out[..., 1] == 128)
    assert torch.all(out[..., 2] == 255)


def test_downsample_uint8_is_a_rounded_area_average():
    frames = _frames(1, 128, 128, 3, seed=3)
    out = _downsample(frames, 64)
    blocks = frames.to(torch.float64).reshape(1, 64, 2, 64, 2, 3).mean(dim=(2, 4))
    assert (out.to(torch.float64) - blocks).abs().max() <= 0.5 + 1e-6


def test_downsample_uint8_observation_spec():
    from torchrl.data import Bounded, Composite

    spec = Composite(pixels=Bounded(0, 255, shape=(500, 500, 3), dtype=torch.uint8))
    out = DownsampleUInt8(64).transform_observation_spec(spec)
    assert out["pixels"].shape == (64, 64, 3)
    assert out["pixels"].dtype == torch.uint8
