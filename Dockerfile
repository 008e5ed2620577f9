# syntax=docker/dockerfile:1
# The sla-planner image: the planner and retrain flows (run by a Prefect worker of a
# Kubernetes work pool), the routing service and that worker. Installs exactly uv.lock.
#   docker build -t registry.example.com/ml-platform/sla-planner:0.1.0 .

FROM python:3.11-slim-bookworm AS build
COPY --from=ghcr.io/astral-sh/uv:0.9 /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_PROJECT_ENVIRONMENT=/opt/venv
WORKDIR /src
# Dependencies first (a layer that changes only with the lock file).
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project --extra kubernetes
COPY planner ./planner
COPY connectors ./connectors
COPY tasks ./tasks
COPY flows ./flows
COPY routing ./routing
COPY sim ./sim
COPY workloads ./workloads
COPY planner_cli ./planner_cli
COPY executor ./executor
RUN uv sync --frozen --no-dev --no-editable --extra kubernetes

FROM python:3.11-slim-bookworm
RUN groupadd --gid 10001 sla && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin sla
COPY --from=build /opt/venv /opt/venv
# Prefect runs a deployment's entrypoint (flows/planner_flow.py:planner_flow) from /app.
WORKDIR /app
COPY flows ./flows
COPY configs ./configs
COPY data/profiles ./data/profiles
COPY data/NOTICE.md ./data/NOTICE.md
COPY prefect.yaml ./
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib PREFECT_HOME=/tmp/prefect
USER 10001:10001
# No ENTRYPOINT: the Kubernetes work pool passes `prefect flow-run execute` as the
# container's arguments, the manifests give each container its command.
CMD ["sla-planner", "--help"]
