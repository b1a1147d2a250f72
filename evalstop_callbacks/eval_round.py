"""One evaluation by the callback's own evaluator: on which processes it runs, timed, its failure named.

A sharding evaluator (each rank scores its shard of the held-out set, then they gather) runs on every rank of a
multi-process run; any other runs on the main process only, and the decision is shared with the others afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .distributed import world
from .evaluators import EvalResult, Evaluator, error_at_step, unwrap_model


@dataclass
class EvalRound:
    """What one evaluation gave on this process.

    Args:
        ran: Whether the evaluator ran here.
        result: Its result (None where it did not run or failed).
        error: Its failure, named with the step, or None.
        seconds: The evaluator's wall time here (0 where it did not run).
        every_rank: Whether it ran on every rank (a failure there is raised on every rank at once).
    """

    ran: bool
    result: EvalResult | None = None
    error: BaseException | None = None
    seconds: float = 0.0
    every_rank: bool = False


def run_evaluator(evaluator: Evaluator, model: object, tok: object, step: int, is_main: bool) -> EvalRound:
    """Evaluate ``model`` at ``step`` where the evaluator runs: every rank for a sharding one, else the main process.

    Args:
        evaluator: The callback's evaluator.
        model, tok: The event's model (unwrapped here: PPO's wrapper, DDP) and processing class.
        step: The step being evaluated (named in a failure).
        is_main: Whether this is the main process.
    """
    every_rank = evaluator.shards and world()[1] > 1
    if not (every_rank or is_main):
        return EvalRound(ran=False)
    t0 = time.perf_counter()
    try:
        result = evaluator.evaluate(unwrap_model(model), tok)
    except Exception as exc:  # noqa: BLE001 - named with the step; the callback raises it on every rank
        return EvalRound(True, None, error_at_step(exc, step), time.perf_counter() - t0, every_rank)
    return EvalRound(True, result, None, time.perf_counter() - t0, every_rank)
