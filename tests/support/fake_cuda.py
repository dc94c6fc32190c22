"""torch.cuda's streams, events, page-locking and copies stood in for on a CPU-only machine
(the ``fake_cuda`` fixture in tests/conftest.py installs it)."""

from __future__ import annotations

import contextlib
import threading

import torch
from tensordict import TensorDict


class FakeStream:
    def __init__(self, cuda: FakeCuda, name: str):
        self.cuda, self.name = cuda, name

    def wait_event(self, event: FakeEvent) -> None:
        self.cuda.log.append(("wait_event", self.name, event))

    def __repr__(self):
        return f"<stream {self.name}>"


class FakeEvent:
    def __init__(self, cuda: FakeCuda):
        self.cuda, self.stream, self.synchronized, self.done = cuda, None, False, False
        self.after_copy_of: set[int] = set()  # host addresses the copy before it reads

    def record(self, stream: FakeStream | None = None) -> None:
        self.stream = stream or self.cuda.current_stream()
        self.after_copy_of = self.cuda.last_copy_reads
        self.cuda.recorded.append(self)
        self.cuda.log.append(("record", self.stream.name, self))

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:  # the host waits for the work before the event
        self.synchronized = self.done = True
        self.cuda.log.append(("synchronize", self))


class FakeCuda:
    """torch.cuda's streams, events, host-memory registration and host-to-device
    copies, stood in for on a CPU-only machine, logging what was asked in which
    order. A TensorDict's ``.to(cuda)`` returns a CPU clone (logged with the stream
    current at the call and its non_blocking flag)."""

    def __init__(self, monkeypatch):
        from torchrl_ext import host_memory

        self.log: list[tuple] = []
        self.registered: dict[int, int] = {}  # address -> bytes page-locked now
        self.unregistered: list[int] = []
        self.last_copy_reads: set[int] = set()
        self.recorded: list[FakeEvent] = []  # every event recorded, oldest first
        self.default_stream = FakeStream(self, "default")
        self._current = threading.local()
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None, **kw: FakeStream(self, "side"))
        monkeypatch.setattr(torch.cuda, "stream", self._use_stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.current_stream())
        monkeypatch.setattr(torch.cuda, "Event", lambda **kw: FakeEvent(self))
        monkeypatch.setattr(torch.Tensor, "record_stream",
                            lambda t, stream: self.log.append(("record_stream", stream.name, t.data_ptr())))
        monkeypatch.setattr(host_memory, "register_host_memory", self._register)
        monkeypatch.setattr(host_memory, "unregister_host_memory", self._unregister)
        original_to = TensorDict.to

        def to(td, *args, **kwargs):
            device = args[0] if args else kwargs.get("device")
            if isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda":
                self.last_copy_reads = {t.data_ptr() for t in td.values(True, True)}
                self.log.append(("copy", self.current_stream().name, kwargs.get("non_blocking", False)))
                return td.clone()
            return original_to(td, *args, **kwargs)

        monkeypatch.setattr(TensorDict, "to", to)

    def current_stream(self) -> FakeStream:
        return getattr(self._current, "stream", self.default_stream)

    @contextlib.contextmanager
    def _use_stream(self, stream: FakeStream):
        before = self.current_stream()
        self._current.stream = stream
        try:
            yield
        finally:
            self._current.stream = before

    def _register(self, address: int, nbytes: int) -> None:
        self.registered[address] = nbytes

    def _unregister(self, address: int) -> None:
        del self.registered[address]
        self.unregistered.append(address)

    def page_locked(self, tensor: torch.Tensor) -> bool:
        """Whether all of ``tensor`` lies in memory registered now."""
        start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
        return any(a <= start and end <= a + n for a, n in self.registered.items())

    def last_copy_out_of(self, tensor: torch.Tensor) -> FakeEvent | None:
        """The event recorded after the latest copy that read ``tensor``'s memory."""
        return next((e for e in reversed(self.recorded) if tensor.data_ptr() in e.after_copy_of), None)

    def events(self, what: str) -> list[tuple]:
        return [entry for entry in self.log if entry[0] == what]
