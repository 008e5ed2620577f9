"""Stand-in names imported by dynamo.planner.core.perf_model (see the package docstring)."""


class _NotInstalled:
    """Any use (construction or a factory) says aisimulate is missing."""

    def __init__(self, *args, **kwargs):
        raise ImportError("aisimulate is not installed: this is sla-planner's import-only stand-in")

    @classmethod
    def best_available(cls, *args, **kwargs):
        raise ImportError("aisimulate is not installed: this is sla-planner's import-only stand-in")

    @classmethod
    def from_legacy_engine_config(cls, *args, **kwargs):
        raise ImportError("aisimulate is not installed: this is sla-planner's import-only stand-in")


class ForwardPassPerfModelConfig(_NotInstalled):
    pass


class RustForwardPassPerfModel(_NotInstalled):
    pass
