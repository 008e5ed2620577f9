"""executor.reconcile and executor.config: table-driven, no processes."""

from __future__ import annotations

import pytest

from executor.config import load_executor_config
from executor.reconcile import Drain, Start, Worker, reconcile


def w(role, slot, pid=None, draining=False):
    return Worker(role, slot, pid if pid is not None else 100 + slot + (50 if role == "decode" else 0), draining)


CASES = [
    # (name, targets, workers, expected)
    ("nothing to do", {"prefill": 1, "decode": 1}, [w("prefill", 0), w("decode", 0)], []),
    ("scale up fills the lowest free slots", {"prefill": 3, "decode": 1}, [w("prefill", 1), w("decode", 0)],
     [Start("prefill", 0), Start("prefill", 2)]),
    ("scale down drains the highest slots first", {"prefill": 1, "decode": 1},
     [w("prefill", 0), w("prefill", 1), w("prefill", 2), w("decode", 0)],
     [Drain(w("prefill", 2)), Drain(w("prefill", 1))]),
    ("drains come before starts", {"prefill": 0, "decode": 2}, [w("prefill", 0), w("decode", 0)],
     [Drain(w("prefill", 0)), Start("decode", 1)]),
    ("a draining worker counts for nothing but keeps its slot", {"prefill": 1, "decode": 1},
     [w("prefill", 0, draining=True), w("decode", 0)], [Start("prefill", 1)]),
    ("a draining worker is not drained twice", {"prefill": 0, "decode": 1},
     [w("prefill", 0, draining=True), w("decode", 0)], []),
    ("a role left out keeps what it has", {"decode": 2}, [w("prefill", 0), w("prefill", 1), w("decode", 0)],
     [Start("decode", 1)]),
    ("from nothing", {"prefill": 2, "decode": 1}, [], [Start("prefill", 0), Start("prefill", 1), Start("decode", 0)]),
    ("a dead worker's slot is refilled", {"prefill": 2, "decode": 1}, [w("prefill", 1), w("decode", 0)],
     [Start("prefill", 0)]),
]


@pytest.mark.parametrize("name,targets,workers,expected", CASES, ids=[c[0] for c in CASES])
def test_reconcile(name, targets, workers, expected):
    assert reconcile(targets, workers) == expected


def test_reconcile_is_idempotent_once_applied():
    actions = reconcile({"prefill": 2, "decode": 3}, [w("decode", 4)])
    after = [w("decode", 4)] + [w(a.role, a.slot) for a in actions if isinstance(a, Start)]
    assert reconcile({"prefill": 2, "decode": 3}, after) == []


def test_negative_target_is_refused():
    with pytest.raises(ValueError, match="prefill: target must be >= 0, got -1"):
        reconcile({"prefill": -1}, [])


GOOD_ROLE = {"command": ["{python}", "-m", "dynamo.mocker", "--x", "{slot}"], "endpoint": "dyn.prefill.generate",
             "system_port_base": 9300}


@pytest.mark.parametrize("change,message", [
    ({"roles": {"prefill": GOOD_ROLE}}, "roles: roles: missing ['decode']"),
    ({"roles": {"prefill": {**GOOD_ROLE, "command": ["{pythn}"]}, "decode": GOOD_ROLE}},
     "roles.prefill.command: command argument '{pythn}': unknown or malformed placeholder"),
    ({"roles": {"prefill": {**GOOD_ROLE, "endpoint": "prefill.generate"}, "decode": GOOD_ROLE}},
     "roles.prefill.endpoint: endpoint must be namespace.component.endpoint"),
    ({"drain_timeout_s": 0}, "drain_timeout_s: Input should be greater than 0"),
    ({"colour": "red"}, "colour: Extra inputs are not permitted"),
])
def test_config_errors_are_one_line_naming_the_field(tmp_path, change, message):
    import yaml

    data = {"state_dir": str(tmp_path / "s"), "roles": {"prefill": GOOD_ROLE, "decode": GOOD_ROLE}, **change}
    path = tmp_path / "executor.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError) as info:
        load_executor_config(path)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"{path}: ")
    assert message in text


def test_config_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"missing.yaml: cannot read executor config: .*No such file"):
        load_executor_config(tmp_path / "missing.yaml")


def test_shipped_executor_config_is_valid():
    from tests.conftest import PROJECT_ROOT

    cfg = load_executor_config(PROJECT_ROOT / "configs" / "executor.yaml")
    assert cfg.roles["decode"].endpoint == "dynamo.backend.generate"
    assert cfg.roles["prefill"].system_port_base + 50 < 32768


def test_cli_bad_config_is_one_line_with_exit_2(tmp_path, capsys):
    from planner_cli.main import main

    path = tmp_path / "executor.yaml"
    path.write_text("roles: {}\nstate_dir: x\n")
    assert main(["executor", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"sla-planner executor: {path}: roles: ") and "\n" not in err
    assert "Traceback" not in err
