"""The documentation table: every Dynamo planner setting, every WVA ConfigMap key, the field of ours it becomes.

The Dynamo guide shows it as generated here (a test keeps the two equal).
"""

from __future__ import annotations

from connectors.migrate.dynamo_settings import LEGACY_FLAGS
from connectors.migrate.dynamo import DIFFERENCES, DYNAMO_FIELDS
from connectors.migrate.wva import WVA_FIELDS


def mapping_table() -> str:
    """The Markdown table of every Dynamo setting and WVA field, as docs/dynamo.md shows it."""
    legacy = {}
    for flag, key in LEGACY_FLAGS.items():
        legacy.setdefault(key, []).append(f"`--{flag.replace('_', '-')}`")
    rows = ["| Dynamo 1.6.1 `--config` key (pre-1.0 flag) | sla-planner | how |", "|---|---|---|"]
    for key, (ours, how) in DYNAMO_FIELDS.items():
        flags = ", ".join(legacy.get(key, []))
        name = f"`{key}`" + (f" ({flags})" if flags else "")
        rows.append(f"| {name} | {f'`{ours}`' if ours else 'not mapped'} | {how} |")
    rows += ["", "| WVA ConfigMap key | sla-planner | how |", "|---|---|---|"]
    for key, (ours, how) in WVA_FIELDS.items():
        rows.append(f"| `{key}` | {f'`{ours}`' if ours else 'not mapped'} | {how} |")
    return "\n".join(rows) + "\n"



def differences_table() -> str:
    """The Markdown table of where the importer deliberately differs from Dynamo 1.6.1, as docs/dynamo.md shows it."""
    rows = ["| Dynamo setting | where `import dgd` differs from Dynamo 1.6.1, and why |", "|---|---|"]
    rows += [f"| `{key}` | {why} |" for key, why in DIFFERENCES.items()]
    return "\n".join(rows) + "\n"
