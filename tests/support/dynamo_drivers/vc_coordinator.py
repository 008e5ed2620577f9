"""Dynamo 1.6.1's real VirtualConnectorCoordinator (the planner side), driven by stdin lines.

usage: python vc_coordinator.py NAMESPACE   (ETCD_ENDPOINTS in the environment)
stdin: "decide P D" -> update_scaling_decision(P, D); "state" -> only print the state; "exit" -> shut down (revokes its lease).
stdout: one JSON line per command with the coordinator's read_state() afterwards.
The arguments are the 1.6.1 planner's (check every 10 s, wait 1800 s, 180 retries), but a 1 s check.
"""

import asyncio
import json
import sys

from dynamo._core import DistributedRuntime, VirtualConnectorCoordinator


async def main(namespace: str) -> None:
    loop = asyncio.get_running_loop()
    runtime = DistributedRuntime(loop, "etcd", "tcp", event_plane="zmq")
    coordinator = VirtualConnectorCoordinator(runtime, namespace, 1, 1800, 180)
    await coordinator.async_init()
    print(json.dumps({"event": "ready"}), flush=True)
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if not line or line[0] == "exit":
            break
        if line[0] == "decide":
            await coordinator.update_scaling_decision(int(line[1]), int(line[2]))
        state = coordinator.read_state()
        print(json.dumps({"event": "state", "decision_id": state.decision_id, "prefill": state.num_prefill_workers,
                          "decode": state.num_decode_workers, "ready": await coordinator.is_scaling_ready()}),
              flush=True)
    runtime.shutdown()


asyncio.run(main(sys.argv[1]))
