"""A run from start to end.

- ``build``: every collaborator, built once in the one order that works;
- ``trainer``: the loop (collect -> store -> update -> sync / log / eval / checkpoint);
- ``state``: ``Run`` (what the loop drives), counters, cadence, checkpoint state;
- ``cadence``: ``Every`` and ``Ratio`` counters;
- ``stopping``: stop signals, ``train.max_minutes``, the rank vote, requeue;
- ``checkpoint``: atomic save, rotation, safe load; ``resume``: the saved config wins;
- ``lock``: one writer per run directory (an advisory lock held for the run's life);
- ``health``: stop after K non-finite updates; ``result``: ``RunResult`` and summary.json.
"""
