"""What the machine gives the run, decided once at start.

- ``device``: learner device, autocast, CUDA math settings;
- ``cpus``: usable cores (affinity, cgroup quota, ranks per node) -> workers vs learner threads;
- ``memory``: the learner's malloc policy;
- ``compile`` / ``compile_cache``: torch.compile arguments, inductor cache and portable artifacts;
- ``distributed``: torchrun ranks, gradient averaging, votes;
- ``profiling``: the traced window and merged trace;
- ``torch_version``: the supported torch range, checked at start-up.
"""
