"""A STAND-IN for NVIDIA's `aisimulate` package, which installs only from NVIDIA's own index.

Dynamo 1.6.1 imports `aisimulate_core.sdk` at module level on the path
`dynamo.planner` -> connectors -> core -> state_machine -> perf_model, so without it
neither its Kubernetes connector nor the mocker's `--planner-profile-data`
conversion imports. Nothing on those paths calls it: the two names in `sdk`
raise ImportError if anything ever does. scripts/install_dynamo.sh copies this
folder into the Dynamo environment's site-packages; the planner's own
environment never sees it.
"""
