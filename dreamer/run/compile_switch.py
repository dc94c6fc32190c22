"""The switch from eager updates to compiled ones when a background compile is done.

With ``compile.background`` the trainer's first update runs eager and sizes the
compile child (dreamer/run/background_compile.py); the child starts after it, and
takes one of the learner's intra-op threads while it runs. Before each update the
trainer asks :meth:`CompileSwitch.poll`; once the child is done the learner
compiles (cache hits), and the first compiled update's cache lookups are logged.
"""

from __future__ import annotations

import logging

import torch

from dreamer.run.background_compile import BackgroundCompile, too_little_memory_for_child
from dreamer.run.state import Run
from dreamer.system import compile_cache

log = logging.getLogger("dreamer")


class CompileSwitch:
    """One run's background compile, from its start to the first compiled update."""

    def __init__(self, run: Run):
        self.built = run  # the run's collaborators (dreamer.run.build)
        self.due = False  # start the child after the next update, sized by it
        self.child: BackgroundCompile | None = None  # the child compiling
        self.switched_at: int | None = None  # the update that first ran the compiled path
        self._lookups_at_switch: dict[str, int] | None = None  # compile-cache counters at the switch
        self._learner_threads = torch.get_num_threads()

    def start(self, update_bytes: int) -> None:
        """The compile child, if it fits in memory beside this run (else updates stay eager)."""
        run = self.built
        self.due = False
        short = too_little_memory_for_child(update_bytes, run.device)
        if short is not None:
            log.warning(short)
            return
        self._learner_threads = torch.get_num_threads()
        self.child = BackgroundCompile(
            run.cfg, run.device, run.learner.autocast_dtype, run.replay.sample(), run.run_dir,
            threads=self._learner_threads,  # what the compiled update will run with here
            timeout_s=60.0 * run.cfg.compile.background_timeout_minutes,
        )
        run.teardown.callback(self.child.cancel)  # a run that ends first stops it
        log.info("compiling the actor/value losses in the background (pid %d; the first update took %.2f GiB, "
                 "which its warm-up repeats); updates run eager until then", self.child.process.pid,
                 update_bytes / 2**30)
        # The child takes a core: give it one of the learner's threads meanwhile.
        # Intra-op threads that outnumber the free cores wait at every barrier for
        # a descheduled sibling, which slows the learner by orders of magnitude.
        if self._learner_threads > 1:
            torch.set_num_threads(self._learner_threads - 1)

    def poll(self) -> None:
        """Before an update: once the child is done, that update runs the compiled path."""
        if self.child is None:
            return
        result = self.child.poll()
        if result is None:
            return
        self.child = None
        torch.set_num_threads(self._learner_threads)  # the child's core is free again
        if "error" in result:
            log.warning("background compile failed, the losses stay eager: %s", result["error"])
            return
        n = self.built.counters
        n.timers.compile_warmup_s = result["seconds"]
        n.timers.compile_background_s = result["wall_s"]
        self.built.learner.compile()
        self._lookups_at_switch = compile_cache.cache_lookups()
        self.switched_at = n.updates + 1
        log.info("background compile done in %.1f s: the %s update path from update %d on",
                 result["wall_s"], self.built.learner.update_path.value, self.switched_at)

    def after_update(self, seconds: float) -> None:
        """After each update: the first compiled one traced again and read the compile caches."""
        run, n = self.built, self.built.counters
        if self.switched_at != n.updates:
            return
        lookups = compile_cache.lookups_since(self._lookups_at_switch)
        n.timers.compile_switch_s = seconds
        n.timers.compiled_from_update = self.switched_at
        n.timers.compile_switch_cache_misses = lookups["misses"]
        log.info("first compiled update: %.1f s (dynamo tracing; compile caches: %d hits, %d misses)",
                 seconds, lookups["hits"], lookups["misses"])
        if lookups["misses"]:
            # The child compiles under this process's settings into the inherited
            # TORCHINDUCTOR_CACHE_DIR; a miss means something in a cache key differed.
            log.warning("the first compiled update compiled %d graph(s) again that the background compile "
                        "should have left in the cache: the switch took %.0f s instead of seconds",
                        lookups["misses"], seconds)
        if run.ranks.is_main:
            run.save_compile_artifact()
