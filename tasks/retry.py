"""The retry policy of every task that crosses the network: backoff, and retry only what a retry can fix."""

from __future__ import annotations

from prefect.cache_policies import NO_CACHE

from connectors.base import ConcurrentWriteError

# Backoff for calls that cross the network: 2 s, 4 s, 8 s, then the run fails visibly.
NETWORK_RETRY_DELAYS_S = [2, 4, 8]
# What a retry can fix: an unreachable backend or a lost optimistic-concurrency race.
# A 403/404 or a bad query fails at once, naming the problem.
RETRYABLE = (ConnectionError, TimeoutError, ConcurrentWriteError)


def retry_if_transient(task, task_run, state) -> bool:
    """Prefect retry condition: retry only exceptions a retry can fix."""
    try:
        state.result()
    except RETRYABLE:
        return True
    except BaseException:
        return False
    return False


network_task = dict(
    retries=len(NETWORK_RETRY_DELAYS_S),
    retry_delay_seconds=NETWORK_RETRY_DELAYS_S,
    retry_condition_fn=retry_if_transient,
    cache_policy=NO_CACHE,
)
