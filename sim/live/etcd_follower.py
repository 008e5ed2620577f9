"""The deployment environment's side of the virtual connector's etcd keys: read targets, confirm."""

from __future__ import annotations

from urllib.parse import urlsplit


class EtcdFollower:
    """The deployment environment's side of the virtual protocol: read targets, confirm."""

    def __init__(self, etcd_url: str, *, namespace: str, key_prefix: str = "v1/{namespace}/planner/",
                 timeout_s: float = 2.0):
        from etcd3gw.client import Etcd3Client

        from connectors.virtual import KEY_DECISION_ID, KEY_DECODE, KEY_PREFILL, KEY_SCALED_ID

        parts = urlsplit(etcd_url)
        self.url = etcd_url
        self.prefix = key_prefix.format(namespace=namespace)
        self.keys = (KEY_DECISION_ID, KEY_PREFILL, KEY_DECODE, KEY_SCALED_ID)
        self._client = Etcd3Client(host=parts.hostname or "127.0.0.1", port=parts.port or 2379,
                                   protocol=parts.scheme or "http", timeout=timeout_s)

    def read(self) -> dict[str, int]:
        """The stored integer keys that exist (decision_id, targets, scaled_decision_id)."""
        out: dict[str, int] = {}
        for value, meta in self._client.get_prefix(self.prefix):
            key = meta["key"].decode() if isinstance(meta["key"], bytes) else meta["key"]
            name = key[len(self.prefix):]
            if name in self.keys:
                try:
                    out[name] = int(value.decode())
                except ValueError:
                    raise ValueError(f"etcd {key}: expected an integer, got {value!r}") from None
        return out

    def confirm(self, decision_id: int) -> None:
        self._client.put(self.prefix + self.keys[3], str(decision_id))
