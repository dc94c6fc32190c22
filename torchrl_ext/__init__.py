"""Small extensions of TorchRL that upstream lacks, each written to be sent upstream.

Nothing here imports ``dreamer``.
"""

from torchrl_ext.capture import CapturedStep
from torchrl_ext.collectors import WORKER_KEY, SchemeClosingMultiAsyncCollector, WorkerTaggingMultiAsyncCollector
from torchrl_ext.device import module_to
from torchrl_ext.dreamer_v3 import (
    OneCriticPassDreamerV3ActorLoss,
    SyncFreeDreamerV3ValueLoss,
    replay_lambda_returns,
)
from torchrl_ext.fixed_specs import FixedSpecsDreamerEnv
from torchrl_ext.held_out import held_out_view, shares_weights, stale_held_out_views
from torchrl_ext.host_memory import page_locked_like
from torchrl_ext.imagination import (
    BatchedRewardDreamerEnv,
    FixedBoundsTanhNormal,
    NonTerminatingDreamerEnv,
    ScoreFunctionDreamerEnv,
    TraceableOneHotCategorical,
)
from torchrl_ext.intra_op import use_one_intra_op_thread
from torchrl_ext.obs_decoder import MatmulObsDecoder
from torchrl_ext.optim import SkippableDreamerV3Optimizer
from torchrl_ext.replay import (
    DeliversSamplesInto,
    PinnedLazyTensorStorage,
    PlainWriteReplayBuffer,
    SliceCursorWriter,
    StagedDeviceReplayBuffer,
)
from torchrl_ext.rssm import (
    CacheableRSSMPrior,
    LeanRSSMRolloutV3,
    PriorTransition,
    SelectiveRSSMRollout,
    SplitInputBlockGRU,
    class_softmax,
    eager_rollout_step,
    split_block_gru_inputs,
    straight_through_categorical,
)
from torchrl_ext.soft_update import SkippableSoftUpdate, masked_lerp_
from torchrl_ext.storage_state import filled_storage_state, leading_rows, load_filled_storage_state
from torchrl_ext.stream_replay import StreamSliceSampler, StreamStepWriter
from torchrl_ext.tensordict_fast_path import install_from_any_fast_path
from torchrl_ext.weight_sync import (
    LivenessCheckedSharedMemWeightSyncScheme,
    NonBlockingSharedMemWeightSyncScheme,
    ReceiverDied,
)

__all__ = [
    "BatchedRewardDreamerEnv",
    "CapturedStep",
    "CacheableRSSMPrior",
    "DeliversSamplesInto",
    "FixedBoundsTanhNormal",
    "FixedSpecsDreamerEnv",
    "LeanRSSMRolloutV3",
    "LivenessCheckedSharedMemWeightSyncScheme",
    "MatmulObsDecoder",
    "NonBlockingSharedMemWeightSyncScheme",
    "NonTerminatingDreamerEnv",
    "OneCriticPassDreamerV3ActorLoss",
    "PinnedLazyTensorStorage",
    "PriorTransition",
    "PlainWriteReplayBuffer",
    "ReceiverDied",
    "SchemeClosingMultiAsyncCollector",
    "ScoreFunctionDreamerEnv",
    "SelectiveRSSMRollout",
    "SkippableDreamerV3Optimizer",
    "SkippableSoftUpdate",
    "SliceCursorWriter",
    "SplitInputBlockGRU",
    "StagedDeviceReplayBuffer",
    "StreamSliceSampler",
    "StreamStepWriter",
    "SyncFreeDreamerV3ValueLoss",
    "TraceableOneHotCategorical",
    "WORKER_KEY",
    "WorkerTaggingMultiAsyncCollector",
    "held_out_view",
    "install_from_any_fast_path",
    "module_to",
    "eager_rollout_step",
    "page_locked_like",
    "shares_weights",
    "stale_held_out_views",
    "use_one_intra_op_thread",
    "replay_lambda_returns",
    "split_block_gru_inputs",
    "straight_through_categorical",
    "class_softmax",
    "filled_storage_state",
    "leading_rows",
    "masked_lerp_",
    "load_filled_storage_state",
]
