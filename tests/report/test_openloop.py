"""dreamer/report/openloop.py: the open-loop video shows the replayed frames, the world
model's posterior reconstructions for the observed context, predictions made
from actions alone after it, and their error, for V1 and V3 alike."""

from __future__ import annotations

import pytest
import torch

from dreamer.algos.registry import ALGORITHMS
from dreamer.config import validate
from dreamer.data.replay import stored_keys
from dreamer.data.transforms import PixelPreprocess
from dreamer.envs.factory import close_env, make_env
from dreamer.envs.keys import PIXELS_KEY
from dreamer.errors import UserError
from dreamer.report.openloop import (
    ERROR_GAIN,
    check_openloop_config,
    openloop_enabled,
    openloop_video,
    pixel_value_range,
    to_uint8,
    video_grid,
)
from tests.support.batches import collector_batch
from tests.support.configs import tiny_config
from tests.support.learners import new_learner

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

CPU = torch.device("cpu")
B, T, K = 3, 6, 2  # sequences, steps per sequence, observed context steps
SIZE = 64


def _config(algo: str):
    cfg = tiny_config(pixels=True, algo=algo)
    if algo == "dreamer_v3":
        a = cfg.algo
        a.num_categoricals, a.num_classes, a.num_bins, a.mlp_layers = 4, 4, 31, 1
    cfg.buffer.batch_size, cfg.buffer.batch_length = B, T
    cfg.eval.openloop_context = K
    return validate(cfg)


@pytest.fixture(scope="module", params=list(ALGORITHMS))
def setup(request):
    """Untrained tiny pixel models of one algorithm and its learner (for ``prepare``)."""
    cfg = _config(request.param)
    env = make_env(cfg.env, cfg.algo, seed=0)
    try:
        learner = new_learner(cfg, env)
    finally:
        close_env(env)
    return learner.models, learner


def _replayed(seed: int = 0):
    """B*T steps as a replay sample holds them: uint8 (64, 64, 3) frames, env actions."""
    steps = collector_batch(traj_id=0, first_step=0, steps=B * T, seed=seed)
    return steps.select(*stored_keys(PIXELS_KEY), strict=False)


def _video(setup, replayed, *, seed: int = 1, sequences: int = B) -> torch.Tensor:
    models, learner = setup
    torch.manual_seed(seed)  # the posterior and prior sample their latents
    return openloop_video(models, learner.prepare(replayed.clone()), context=K, sequences=sequences)


def _row(video: torch.Tensor, row: int) -> torch.Tensor:
    """(T, 3*64, N*64, 3) grid -> row 0 true, 1 predicted, 2 error as (N, T, 64, 64, 3)."""
    cells = video[:, row * SIZE:(row + 1) * SIZE]  # (T, 64, N*64, 3)
    return cells.reshape(T, SIZE, -1, SIZE, 3).permute(2, 0, 1, 3, 4)


def test_grid_is_a_uint8_video_of_true_predicted_error_rows_by_sequence(setup):
    replayed = _replayed()
    video = _video(setup, replayed, sequences=2)
    assert video.dtype == torch.uint8 and video.shape == (T, 3 * SIZE, 2 * SIZE, 3)
    # The true row shows the replayed frames, sequence by sequence, step by step.
    frames = replayed.get(("next", PIXELS_KEY)).reshape(B, T, SIZE, SIZE, 3)
    assert torch.equal(_row(video, 0), frames[:2])
    # More sequences asked for than one batch holds: all of them.
    assert _video(setup, replayed, sequences=10).shape == (T, 3 * SIZE, B * SIZE, 3)


def test_first_context_frames_are_the_posterior_reconstructions(setup):
    models, learner = setup
    replayed = _replayed()
    video = _video(setup, replayed, seed=1)
    # The world model as trained (encoder, posterior rollout, decoder) on the
    # observed steps, drawing the same latent samples (same seed, same shapes).
    torch.manual_seed(1)
    observed = models.world_model(learner.prepare(replayed.clone())[:, :K])
    value_range = pixel_value_range(models.modules["preprocess"], CPU)
    expected = to_uint8(observed.get(("next", "reco_" + PIXELS_KEY)), value_range)  # (B, K, 64, 64, 3)
    assert torch.equal(_row(video, 1)[:, :K], expected)


def test_predictions_after_the_context_come_from_actions_not_frames(setup):
    replayed = _replayed()
    video = _video(setup, replayed)
    later_frames = replayed.clone()
    frames = later_frames.get(("next", PIXELS_KEY)).view(B, T, SIZE, SIZE, 3)
    frames[:, K:] = 255 - frames[:, K:]
    changed = _video(setup, later_frames)
    assert not torch.equal(_row(changed, 0), _row(video, 0))
    assert torch.equal(_row(changed, 1), _row(video, 1))  # the predictions never saw them

    context_frames = replayed.clone()
    frames = context_frames.get(("next", PIXELS_KEY)).view(B, T, SIZE, SIZE, 3)
    frames[:, :K] = 255 - frames[:, :K]
    assert not torch.equal(_row(_video(setup, context_frames), 1)[:, K:], _row(video, 1)[:, K:])

    later_actions = replayed.clone()
    actions = later_actions.get("action").view(B, T, -1)
    actions[:, K:] = -actions[:, K:]
    driven = _row(_video(setup, later_actions), 1)
    assert torch.equal(driven[:, :K], _row(video, 1)[:, :K])
    assert not torch.equal(driven[:, K:], _row(video, 1)[:, K:])


def test_error_row_is_the_scaled_absolute_difference(setup):
    video = _video(setup, _replayed())
    true, predicted, error = (_row(video, r).short() for r in range(3))
    assert torch.equal(error, ((true - predicted).abs() * ERROR_GAIN).clamp(max=255))
    assert error.any()  # noise frames are not what an untrained model predicts


def test_a_perfect_reconstruction_shows_the_frames_and_zero_error(setup):
    models, _ = setup
    preprocess = models.modules["preprocess"]  # V1: [-0.5, 0.5]; V3: [0, 1]
    # every uint8 value, many times over
    frames = (torch.arange(2 * SIZE * SIZE * 3) % 256).to(torch.uint8).view(1, 2, SIZE, SIZE, 3)
    images = preprocess(frames)  # (1, 2, 3, 64, 64) float, what the decoder is trained to predict
    video = video_grid(images, images.clone(), pixel_value_range(preprocess, CPU))  # (2, 192, 64, 3)
    assert torch.equal(video[:, :SIZE], frames[0])
    assert torch.equal(video[:, SIZE:2 * SIZE], frames[0])
    assert not video[:, 2 * SIZE:].any()


def test_grayscale_frames_show_as_grey_with_zero_error_when_perfect():
    preprocess = PixelPreprocess(SIZE, grayscale=True)
    frames = torch.randint(0, 256, (1, 2, SIZE, SIZE, 3), dtype=torch.uint8)
    images = preprocess(frames)  # (1, 2, 1, 64, 64)
    video = video_grid(images, images.clone(), pixel_value_range(preprocess, CPU))
    assert video.shape == (2, 3 * SIZE, SIZE, 3)
    assert torch.equal(video[..., 0], video[..., 1]) and torch.equal(video[..., 0], video[..., 2])
    assert not video[:, 2 * SIZE:].any()


def test_context_must_leave_a_step_to_predict():
    cfg = tiny_config(pixels=True)  # batch_length 5
    cfg.eval.openloop_context = 5
    with pytest.raises(UserError, match=r"eval.openloop_context=5 leaves no step to predict in "
                                        r"buffer.batch_length=5 sequences: set eval.openloop_context<=4"):
        check_openloop_config(cfg.eval, cfg.env, cfg.buffer.batch_length)
    cfg.eval.openloop_context = 4
    check_openloop_config(cfg.eval, cfg.env, cfg.buffer.batch_length)
    # No report, nothing to check: openloop off, or no images (state observations).
    cfg.eval.openloop, cfg.eval.openloop_context = False, 5
    check_openloop_config(cfg.eval, cfg.env, cfg.buffer.batch_length)
    assert not openloop_enabled(cfg.eval, cfg.env)
    states = tiny_config()
    states.eval.openloop_context = 5
    check_openloop_config(states.eval, states.env, states.buffer.batch_length)
    assert states.eval.openloop and not openloop_enabled(states.eval, states.env)
