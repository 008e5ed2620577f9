"""The read-only connector an advisory run uses, around the local connector: reads pass, a write is refused."""

from __future__ import annotations

import pytest

from connectors.base import ConnectorError
from connectors.config import LocalConnectorConfig
from connectors.factory import make_connector
from connectors.read_only import ReadOnlyConnector
from planner.types import Decision


def test_reads_go_through_and_apply_is_refused_in_one_line(tmp_path):
    state = tmp_path / "fleet.json"
    inner = make_connector(LocalConnectorConfig(state_path=str(state), initial_prefill_replicas=2,
                                                initial_decode_replicas=3))
    connector = ReadOnlyConnector(inner)
    connector.validate()
    fleet = connector.read_fleet(now_s=100.0)
    assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == (2, 3)
    assert connector.last_decision_done(now_s=100.0) is True
    with pytest.raises(ConnectorError) as err:
        connector.apply(Decision(prefill_replicas=4, decode_replicas=3, apply=True, reasons=()), now_s=100.0)
    assert str(err.value) == ("advisory mode (planner.mode advisory): a run writes nothing, but was asked to apply "
                              "prefill 4, decode 3")
    assert inner.read_fleet(now_s=200.0).prefill.current_replicas == 2
    assert not state.exists() or "decision" not in state.read_text()
