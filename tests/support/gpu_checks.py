"""The lines of scripts/gpu_check.py's report: each names what its marked tests prove.

A test joins a line with ``@pytest.mark.gpu_acceptance(NAME)`` (the CPU-provable subset: the CUDA
path's fixes shown on the CPU, CUDA stood in for where needed) or ``@pytest.mark.cuda(NAME)`` (needs
a GPU). gpu_check collects the markers, so a renamed test cannot fall out of it.
"""

# The CPU-provable subset.
V1_NO_HOST_TRANSFER = "V1 update makes no host transfer (spy; states, pixels)"
V3_NO_HOST_TRANSFER = "V3 update makes no host transfer (spy; states, pixels; pathwise and REINFORCE actor)"
RANK_VOTE_NO_HOST_TRANSFER = "2 ranks: the stop vote adds no host transfer per update"
CHECKPOINT_RESUME = "checkpoint -> resume on CPU; a GPU-shaped checkpoint (8 CUDA RNG states) resumes"
NAN_REWARD = "NaN reward: step skipped, counted, weights unchanged (V1, V3)"
WORKER_POLICY_DEVICE = "workers' policy tensors all on the collector device (V1, V3; states, pixels)"
PAGE_LOCKED_STAGED_REPLAY = "replay: page-locked exactly; staged gather, side stream + event (CUDA stood in for)"
REPLAY_SIZE_PER_NODE = "replay size checked per node, against cgroup memory limits and VRAM"
WEIGHT_PUSH_NEVER_WAITS = "weight push to workers never waits (staged copy + event, deferred publish)"
WORKERS_AND_THREADS = "workers and threads from CPU affinity, cgroup quota, ranks per node"
CUDA_MISTAKES = "device=cuda mistakes are one line; autocast picks native bf16 only; TF32 / cudnn settings"
CUDA_GRAPHS_ASKED = "CUDA graphs only on the explicit ask; collectors on CUDA refused"
MUJOCO_GL_PROBE = "MUJOCO_GL probed in order; each rank renders on its own GPU under EGL"
DEVICE_CLOCK = "timing waits for CUDA work (device clock)"

# Needs a GPU.
COMPILED_UPDATES_CUDA = "compiled V1/V3 updates on CUDA: no sync (sync-debug error), no re-trace, bf16 where native"
EAGER_UPDATES_CUDA = "eager V1/V3 updates on CUDA: no sync (sync-debug error)"
REPLAY_CUDA = "replay on CUDA: pinned storage, staged samples equal upstream's, no sync"
WEIGHT_PUSH_CUDA = "weight push from CUDA: no sync, the weights of its moment"
NAN_REWARD_CUDA = "NaN reward on CUDA: step skipped, counted, weights unchanged (V1, V3)"
RSSM_FORWARDS_CUDA = ("V3 RSSM forwards on CUDA (split-input block GRU, categorical sampler) match upstream's, "
                      "fp32 and bf16")
TRANSFORMS_CUDA = "pixel transforms on CUDA match the CPU's"
BACKGROUND_COMPILE_CUDA = "background compile sized on CUDA: the allocator's peak, the GPU's free memory"
CAPTURED_UPDATE_CUDA = ("captured V3 update (and V1 eager) on CUDA: eager numbers, non-finite skip, no sync, no "
                        "allocation, re-capture on new shape or resume, replay fills its inputs")
