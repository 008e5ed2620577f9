"""Dynamo 1.6.1's real VirtualConnectorClient, as a launcher runs it. One JSON line per event on stdout.

usage: python vc_client.py NAMESPACE auto|manual   (ETCD_ENDPOINTS in the environment)
auto: acknowledge every decision at once; manual: acknowledge the newest one on each "ack" line on stdin.
Runs until SIGTERM; its acknowledgement is leased to this process, as in any real launcher.
"""

import asyncio
import json
import signal
import sys

from dynamo._core import DistributedRuntime, VirtualConnectorClient


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


async def main(namespace: str, mode: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    runtime = DistributedRuntime(loop, "etcd", "tcp", event_plane="zmq")
    client = VirtualConnectorClient(runtime, namespace)
    pending = asyncio.Queue()

    async def watch() -> None:
        wakes = 0
        while True:
            await client.wait()
            wakes += 1
            try:
                d = await client.get()
            except Exception as exc:  # noqa: BLE001 - reported to the test
                emit(event="get_error", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.5)
                continue
            emit(event="decision", wakes=wakes, decision_id=d.decision_id, prefill=d.num_prefill_workers,
                 decode=d.num_decode_workers)
            if mode == "auto":
                await client.complete(d)
                emit(event="acked", decision_id=d.decision_id)
            else:
                await pending.put(d)
                while True:  # wait() returns at once while the decision is unacknowledged
                    line = await loop.run_in_executor(None, sys.stdin.readline)
                    if line.strip() == "ack":
                        d = await client.get()
                        await client.complete(d)
                        emit(event="acked", decision_id=d.decision_id)
                        break

    task = asyncio.create_task(watch())
    emit(event="ready")
    await stop.wait()
    task.cancel()
    runtime.shutdown()


asyncio.run(main(sys.argv[1], sys.argv[2]))
