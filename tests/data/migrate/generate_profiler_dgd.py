# Reproduces dynamo-1.6.1-profiler-vllm-disagg-planner.v1beta1.yaml: run with the ai-dynamo==1.6.1 environment's
# python (WORKSPACE_DIR=/workspace); stubs stand in for the model-info imports the path never calls.
import sys, types
for m in ['huggingface_hub','transformers']:
    mod=types.ModuleType(m); mod.hf_hub_download=None; mod.model_info=None; mod.AutoConfig=None; sys.modules[m]=mod
pd=types.ModuleType('aisimulate_core.sdk.perf_database'); pd.get_latest_database_version=lambda *a,**k: None; sys.modules['aisimulate_core.sdk.perf_database']=pd
import json, sys, yaml, importlib.resources as ir
from pathlib import Path
from dynamo.profiler.utils.dgd_generation import add_planner_to_config, enable_planner_worker_scaling_adapters
from dynamo.profiler.utils.dgdr_v1beta1_types import DynamoGraphDeploymentRequestSpec, HardwareSpec, SLASpec, WorkloadSpec, FeaturesSpec
from dynamo.planner.config.planner_config import PlannerConfig
import dynamo.profiler as prof
tmpl = Path(prof.__file__).parent / "templates/dgd/vllm/disagg.yaml"
config = yaml.safe_load(tmpl.read_text())
planner = PlannerConfig.model_validate({
    "environment": "kubernetes", "backend": "vllm", "optimization_target": "sla",
    "enable_throughput_scaling": True, "enable_load_scaling": False,
    "pre_deployment_sweeping_mode": "none",
    "throughput_adjustment_interval_seconds": 60, "load_adjustment_interval_seconds": 5,
    "ttft_ms": 300, "itl_ms": 20, "max_gpu_budget": 12, "min_endpoint": 2, "decode_min_endpoint": 3,
    "max_throughput_scaling_replicas": 4, "load_predictor": "kalman", "kalman_q_level": 2.0, "kalman_min_points": 8,
    "load_predictor_warmup_trace": "/workspace/traces/mooncake_warmup.jsonl",
    "metric_reporting_prometheus_port": 9085,
})
dgdr = DynamoGraphDeploymentRequestSpec(
    model="Qwen/Qwen3-0.6B", backend="vllm", image="nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1",
    hardware=HardwareSpec(gpuSku="h200_sxm", totalGpus=8, numGpusPerNode=8),
    workload=WorkloadSpec(isl=3000, osl=150), sla=SLASpec(ttft=300.0, itl=20.0),
    features=FeaturesSpec(planner=planner),
)
enable_planner_worker_scaling_adapters(config, planner)
cm = add_planner_to_config(dgdr, config)
print(yaml.safe_dump_all([config, cm], sort_keys=False))
