"""What evaluation metrics are called: named for the policy that played the episodes
(``eval.policy``), so curves of a sampling and of a mode policy never mix. No torch
import: the learning check and plots read records with it."""

from __future__ import annotations

EVAL_POLICIES = ("sample", "mode")


def return_key(policy: str, stat: str = "mean") -> str:
    """The metric an evaluation's return is logged under: ``eval_sample_return_mean``, ..."""
    return f"eval_{policy}_return_{stat}"


# Runs from before eval.policy existed logged their evaluations, played by the mode, under
# this name: plots and the learning check still read them next to new runs.
LEGACY_RETURN_KEY = "eval_return_mean"


def eval_return(record: dict) -> float | None:
    """The evaluated return a metrics record holds, whichever policy played it; None in
    records without an evaluation."""
    for policy in EVAL_POLICIES:
        if return_key(policy) in record:
            return record[return_key(policy)]
    return record.get(LEGACY_RETURN_KEY)
