"""What a run reports.

- ``logger``: metrics.jsonl, CSV / W&B, videos, summary.json, learning curve;
- ``evaluation``: deterministic evaluation episodes;
- ``openloop``: open-loop imagination video of the world model;
- ``plots``: learning curves of one or many runs.
"""
