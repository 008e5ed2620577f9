"""How a subcommand's parser is built: the module docstring as its --help page, the planner run config option."""

from __future__ import annotations

import argparse
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "planner.yaml"


def command_parser(subparsers, name: str, *, help: str, doc: str | None) -> argparse.ArgumentParser:
    """The subcommand `name`: `help` is its line in `sla-planner --help`, `doc` (the module docstring) its own page."""
    return subparsers.add_parser(name, help=help, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_config_option(p: argparse.ArgumentParser) -> None:
    """--config: the planner run config YAML, configs/planner.yaml by default."""
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="planner run config YAML (default: %(default)s)")
