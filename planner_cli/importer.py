"""`sla-planner import`: our run configuration from Dynamo's planner or llm-d's WVA settings.

  sla-planner import dgd FILE | --live NAME [--namespace NS] [--profile-dir DIR] [-o OUT]
  sla-planner import dgd FILE FILE... --fleet-out FLEET --budget-gpus N [--namespace NS] [--profile-dir DIR]
  sla-planner import wva FILE... | --live NAME... [--namespace NS] [--base CONFIG] [-o OUT]
  sla-planner import llmd FILE... [--pool NAME] | --live --pool NAME [--namespace NS] [--base CONFIG] [-o OUT]

`dgd` reads a DynamoGraphDeployment (v1alpha1 or v1beta1; a YAML file, which
may also hold the planner-config ConfigMap its Planner mounts, or the cluster's
copy with --live) and maps its planner's settings: `--config` JSON or file
(Dynamo 1.x) or flags (before 1.0), and the environment the planner reads.
With several DGD files and --fleet-out, each becomes its own run configuration (named after its DGD,
beside the fleet file) and the fleet file lists them, priority 1 each, under --budget-gpus (docs/fleet.md);
the fleet is checked as `load_fleet` checks it (two DGDs scaling one target, minimums above the budget)
before anything is written.
`wva` reads WVA's saturation ConfigMap (and its controller ConfigMap).
`llmd` reads llm-d's KEDA ScaledObjects (one per role), WVA VariantAutoscalings and their HPAs:
replica bounds, polling, stabilization, model, and with --pool the llm-d connector.

The result is written as YAML (stdout, or -o, then one line saying what was written),
merged over --base when given: each value of the base it replaces is a `note:` line
(WVA's controller ConfigMap brings its Prometheus URL and TLS setting, which replace
the base's). It loads through our models before it is written. Each setting that could not
be mapped is one line on stderr: the key, its value and why; so is each value
read differently from Dynamo on purpose (`note:`). Bad input (not a DGD or
ConfigMap, no planner, unreadable YAML, a value that does not validate, a
setting Dynamo 1.6.1's planner would refuse to start with) is one line and
exit 2; `--lenient` skips (and lists) what Dynamo would refuse instead. The mapping: docs/dynamo.md, "Migrating from Dynamo's
planner or WVA".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner_cli.command import command_parser

PROG = "sla-planner import"


def add_parser(subparsers) -> None:
    p = command_parser(subparsers, "import", doc=__doc__,
                       help="write our config from a Dynamo DGD's planner settings or a WVA ConfigMap (migration)")
    kinds = p.add_subparsers(dest="source_kind", metavar="SOURCE")
    kinds.required = True
    dgd = kinds.add_parser("dgd", help="a DynamoGraphDeployment with a planner component")
    dgd.add_argument("file", nargs="*", metavar="FILE", help="DGD YAML (may also hold the planner's ConfigMap); "
                     "several with --fleet-out")
    dgd.add_argument("--fleet-out", default=None, metavar="FLEET",
                     help="write a fleet file here listing one run configuration per DGD (written beside it)")
    dgd.add_argument("--budget-gpus", type=int, default=None, metavar="N",
                     help="the fleet's GPU budget (with --fleet-out)")
    dgd.add_argument("--profile-dir", default=None, metavar="DIR",
                     help="the profiler output on this machine (replaces the in-cluster profile_results_dir)")
    dgd.add_argument("--lenient", action="store_true",
                     help="skip (and list) settings Dynamo 1.6.1 would refuse to start with instead of exit 2")
    wva = kinds.add_parser("wva", help="llm-d WVA saturation (and controller) ConfigMaps")
    wva.add_argument("file", nargs="*", metavar="FILE", help="ConfigMap YAML files")
    llmd = kinds.add_parser("llmd", help="llm-d's KEDA ScaledObjects and WVA VariantAutoscalings")
    llmd.add_argument("file", nargs="*", metavar="FILE", help="YAML files of ScaledObjects / VariantAutoscalings")
    llmd.add_argument("--pool", default=None, metavar="NAME", help="the InferencePool whose servers they scale "
                      "(connector kind llmd)")
    llmd.add_argument("--live", action="store_true", help="read the ScaledObjects that scale --pool's model servers "
                      "from the cluster instead of files")
    llmd.add_argument("--namespace", default=None, metavar="NS", help="the pool's Kubernetes namespace (--live)")
    llmd.add_argument("--kubeconfig", default=None, metavar="PATH", help="kubeconfig (--live)")
    llmd.add_argument("--context", default=None, help="kubeconfig context (--live)")
    llmd.add_argument("--base", default=None, metavar="CONFIG", help="a run configuration the result is merged over")
    llmd.add_argument("-o", "--output", default=None, metavar="OUT", help="write the YAML here (default: stdout)")
    for sub, live_help in ((dgd, "read the DGD NAME (and its planner's ConfigMaps) from the cluster"),
                           (wva, "read the ConfigMap(s) NAME from the cluster")):
        sub.add_argument("--live", nargs="+" if sub is wva else None, default=None, metavar="NAME", help=live_help)
        sub.add_argument("--namespace", default=None, metavar="NS", help="Kubernetes namespace (--live; "
                         "a DGD file without metadata.namespace)")
        sub.add_argument("--kubeconfig", default=None, metavar="PATH", help="kubeconfig (--live; default "
                         "$KUBECONFIG or ~/.kube/config, in-cluster when KUBERNETES_SERVICE_HOST is set)")
        sub.add_argument("--context", default=None, help="kubeconfig context (--live)")
        sub.add_argument("--base", default=None, metavar="CONFIG", help="a run configuration the result is merged over")
        sub.add_argument("-o", "--output", default=None, metavar="OUT", help="write the YAML here (default: stdout)")


def _replaced(base: dict, over: dict, prefix: str = ""):
    """(dotted key, base value, new value) for each value of `base` that merging `over` changes."""
    for key, now in over.items():
        if key not in base:
            continue
        was = base[key]
        if isinstance(now, dict) and isinstance(was, dict):
            yield from _replaced(was, now, f"{prefix}{key}.")
        elif was != now:
            yield f"{prefix}{key}", was, now


def _fail(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return 2


def _documents(path: str) -> list:
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not docs:
        raise ValueError(f"{path}: empty: expected a YAML document")
    return docs


def _connector(args, name: str):
    from connectors.config import KubernetesConnectorConfig
    from connectors.kubernetes import KubernetesConnector

    cfg = KubernetesConnectorConfig(dgd_name=name, namespace=args.namespace, kubeconfig_path=args.kubeconfig,
                                    kubeconfig_context=args.context)
    return KubernetesConnector(cfg, default_namespace=args.namespace or "default")


def _from_dgd(args):
    from connectors.base import ConnectorError
    from connectors.migrate.dynamo_settings import dgd_version, planner_configmaps
    from connectors.migrate.result import configmap_data
    from connectors.migrate.dynamo import from_dgd

    if (args.file is None) == (args.live is None):
        raise ValueError("give a DGD file or --live NAME (one of them)")
    configmaps: dict[str, dict[str, str]] = {}
    if args.live is not None:
        connector = _connector(args, args.live)
        obj = connector.read_dgd()
        source = f"DynamoGraphDeployment {connector.namespace}/{args.live}"
        for name in planner_configmaps(obj, source=source):
            try:
                configmaps[name] = configmap_data(connector.read_config_map(name), source=name)[1]
            except ConnectorError:
                pass  # reported by the migration as a --config file whose content is missing
        namespace = (obj.get("metadata") or {}).get("namespace") or connector.namespace
    else:
        source = args.file
        docs = _documents(args.file)
        dgds = [d for d in docs if isinstance(d, dict) and d.get("kind") == "DynamoGraphDeployment"]
        if len(dgds) != 1:
            if dgds:
                raise ValueError(f"{source}: {len(dgds)} DynamoGraphDeployments: give a file with one")
            dgd_version(docs[0], source=source)  # raises: names what the file holds
        obj = dgds[0]
        for d in docs:
            if isinstance(d, dict) and d.get("kind") == "ConfigMap":
                name, data = configmap_data(d, source=source)
                configmaps[name] = data
        namespace = args.namespace
    return from_dgd(obj, configmaps=configmaps, namespace=namespace, profile_dir=args.profile_dir,
                    source=source, lenient=args.lenient), source


def _from_wva(args):
    from connectors.migrate.result import configmap_data
    from connectors.migrate.wva import from_wva

    if bool(args.file) == bool(args.live):
        raise ValueError("give WVA ConfigMap files or --live NAME... (one of them)")
    maps = []
    if args.live:
        for name in args.live:
            maps.append(configmap_data(_connector(args, name).read_config_map(name), source=name))
        source = ", ".join(f"ConfigMap {name}" for name in args.live)
    else:
        for path in args.file:
            maps += [configmap_data(d, source=path) for d in _documents(path)]
        source = ", ".join(args.file)
    return from_wva(maps, source=source), source


def _from_llmd(args):
    from connectors.migrate.keda import from_llmd_autoscalers

    if bool(args.file) == args.live:
        raise ValueError("give ScaledObject / VariantAutoscaling files or --live --pool NAME (one of them)")
    if args.live:
        from connectors.config import LlmdConnectorConfig
        from connectors.llmd import LlmdConnector

        if not args.pool:
            raise ValueError("--live reads the ScaledObjects of an InferencePool: give --pool NAME")
        connector = LlmdConnector(LlmdConnectorConfig(inference_pool=args.pool, namespace=args.namespace,
                                                      kubeconfig_path=args.kubeconfig, kubeconfig_context=args.context),
                                  default_namespace=args.namespace or "default")
        source = f"the ScaledObjects of InferencePool {connector.pool_ref}"
        return from_llmd_autoscalers(connector.read_autoscalers(), inference_pool=args.pool, source=source), source
    docs = [d for path in args.file for d in _documents(path)]
    source = ", ".join(args.file)
    return from_llmd_autoscalers(docs, inference_pool=args.pool, source=source), source


def _imported(args) -> tuple[dict, object, str]:
    """(the run configuration as data, the migration with its notes, its source), checked through our models."""
    from connectors.migrate.result import merge
    from flows.config import PlannerRunConfig
    from planner.config import format_validation_error
    from pydantic import ValidationError

    migration, source = {"dgd": _from_dgd, "wva": _from_wva, "llmd": _from_llmd}[args.source_kind](args)
    base = {}
    if args.base is not None:
        base = _documents(args.base)[0]
        if not isinstance(base, dict):
            raise ValueError(f"{args.base}: expected a run configuration mapping")
    data = merge(base, migration.config)
    for key, was, now in _replaced(base, migration.config):
        migration.note(f"{key}: {was!r} in {args.base} replaced by {now!r} from {source}")
    if "planner" in data and "profile" not in data["planner"]:
        data["planner"]["profile"] = {"dir": "PROFILE_DIR"}
        migration.skip("planner.profile.dir", None, f"not in {source}: set it to the profiler output "
                       "(written as PROFILE_DIR), or pass --base with a configuration that has it")
    try:
        PlannerRunConfig.model_validate(data)
    except ValidationError as exc:
        problems = format_validation_error(exc, source="the imported configuration").splitlines()
        raise ValueError("; ".join(problems)) from None
    return data, migration, source


def _report(migration) -> None:
    for line in migration.notes:
        print(f"{PROG}: note: {line}", file=sys.stderr)
    for item in migration.unmapped:
        print(f"{PROG}: not mapped: {item.line()}", file=sys.stderr)


def _config_text(data: dict, migration, source: str, kind: str) -> str:
    import yaml

    return (f"# sla-planner run configuration imported from {source} by `{PROG} {kind}`;\n"
            f"# {len(migration.unmapped)} setting(s) could not be mapped (listed when it ran).\n"
            + yaml.safe_dump(data, sort_keys=False))


def run(args) -> int:
    from connectors.base import ConnectorError

    if args.source_kind == "dgd":
        if args.fleet_out is not None or len(args.file) > 1:
            return _run_fleet(args)
        args = argparse.Namespace(**{**vars(args), "file": args.file[0] if args.file else None})
    try:
        data, migration, source = _imported(args)
    except (ValueError, ConnectorError) as exc:
        return _fail(" ".join(str(exc).split()))
    _report(migration)
    text = _config_text(data, migration, source, args.source_kind)
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as exc:
            return _fail(f"{args.output}: cannot write: {exc.strerror}")
        print(f"{PROG}: wrote {args.output}, the run configuration from {source} "
              f"({len(migration.unmapped)} setting(s) not mapped, listed above)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _run_fleet(args) -> int:
    """Several DGD files -> one run configuration each beside the fleet file, and the fleet file; all checked
    (each configuration, then the fleet as load_fleet checks it) before any is written."""
    import shutil
    import tempfile

    import yaml

    from connectors.base import ConnectorError
    from flows.fleet_config import load_fleet

    if args.fleet_out is None:
        return _fail("several DGD files make a fleet: give --fleet-out FLEET and --budget-gpus N")
    if args.budget_gpus is None or args.budget_gpus < 1:
        return _fail(f"--fleet-out needs --budget-gpus N (an integer >= 1), got {args.budget_gpus!r}")
    if args.live is not None or args.output is not None or not args.file:
        return _fail("--fleet-out takes DGD files (not --live) and writes beside FLEET (not -o)")
    out = Path(args.fleet_out)
    configs: list[tuple[str, str]] = []
    try:
        for path in args.file:
            one = argparse.Namespace(**{**vars(args), "file": path})
            data, migration, source = _imported(one)
            _report(migration)
            name = _deployment_name(data, taken={n for n, _ in configs})
            configs.append((name, _config_text(data, migration, source, "dgd")))
        fleet = {"budget": {"gpus": args.budget_gpus},
                 "deployments": [{"name": n, "priority": 1, "config": f"{n}.yaml"} for n, _ in configs]}
        fleet_text = (f"# sla-planner fleet imported from {len(configs)} DGDs by `{PROG} dgd --fleet-out`; "
                      f"set each deployment's priority (docs/fleet.md).\n" + yaml.safe_dump(fleet, sort_keys=False))
        with tempfile.TemporaryDirectory(prefix="sla-planner-fleet-") as tmp:
            for name, text in configs:
                (Path(tmp) / f"{name}.yaml").write_text(text)
            (Path(tmp) / out.name).write_text(fleet_text)
            try:
                load_fleet(Path(tmp) / out.name)
            except ValueError as exc:
                raise ValueError(str(exc).replace(str(Path(tmp) / out.name), str(out)).replace(tmp, str(out.parent)))
            out.parent.mkdir(parents=True, exist_ok=True)
            for name, _ in configs:
                shutil.copyfile(Path(tmp) / f"{name}.yaml", out.parent / f"{name}.yaml")
            shutil.copyfile(Path(tmp) / out.name, out)
    except (ValueError, ConnectorError) as exc:
        return _fail(" ".join(str(exc).split()))
    except OSError as exc:
        return _fail(f"{out}: cannot write: {exc.strerror}")
    print(f"{PROG}: wrote {out}, a fleet of {len(configs)} deployments ({', '.join(n for n, _ in configs)}) under "
          f"{args.budget_gpus} GPUs, each run configuration beside it", file=sys.stderr)
    return 0


def _deployment_name(data: dict, *, taken: set[str]) -> str:
    """The DGD's name as a deployment name, made unique with -2, -3, ... (the fleet check then names a shared
    target, not a shared name)."""
    import re

    raw = str((data.get("connector") or {}).get("dgd_name") or "deployment").lower()
    base = re.sub(r"[^a-z0-9.-]+", "-", raw).strip("-.") or "deployment"
    name, i = base[:60], 2
    while name in taken:
        name, i = f"{base[:57]}-{i}", i + 1
    return name
