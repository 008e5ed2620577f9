"""Network tasks retry only what a retry can fix."""

from __future__ import annotations

import pytest
from prefect.states import Failed

from connectors.base import ConcurrentWriteError, ResourceAccessError
from tasks.retry import retry_if_transient


@pytest.mark.parametrize("exc, expected", [
    pytest.param(ConnectionError("prometheus http://x:9090 unreachable"), True, id="unreachable: retry"),
    pytest.param(TimeoutError("etcd timed out"), True, id="timeout: retry"),
    pytest.param(ConcurrentWriteError("decision_id moved"), True, id="lost CAS race: retry"),
    pytest.param(ResourceAccessError("patch dynamographdeployments/x: 403"), False, id="403: fail at once"),
    pytest.param(ValueError("metrics.queries.num_requests: bad PromQL"), False, id="bad query: fail at once"),
])
def test_retry_condition(exc, expected):
    state = Failed(data=exc, message=repr(exc))
    assert retry_if_transient(None, None, state) is expected
