"""The store: the launcher's TCPStore under gpuvet's prefix, the keys every node reads and writes,
and the heartbeat each node beats from a thread.

Why the store and not gather_object: a collective needs every rank and blocks on a dead one; with
keys in the store rank 0 takes whoever posted by the deadline and names the rest.

Store keys (under gpuvet/cluster/<cluster id>/): joined/R, beat/R (a counter: rank 0 watches it
change on its own clock, so clocks need not agree), step/R, record/R (zlib JSON), ready/R,
failed/R, cross/R, plan, abort, final; the logs log/{joined,record,ready,failed,cross,bye} list
ranks, so rank 0 reads six keys per poll, not one per node.
"""

from __future__ import annotations

import json
import threading
import zlib
from datetime import timedelta
from typing import Any

from .launch import Launch, LaunchError

PREFIX = "gpuvet/cluster"
POLL_S = 0.5


class Rendezvous:
    """The launcher's TCPStore under gpuvet's prefix, with the few operations the flow needs."""

    def __init__(self, launch: Launch, connect_timeout_s: float, op_timeout_s: float = 60.0):
        from torch.distributed import TCPStore

        self.launch = launch
        self.prefix = f"{PREFIX}/{launch.cluster_id}/"
        host = launch.rank == 0 and not launch.agent_store
        self._base = TCPStore(launch.master_addr, launch.master_port, None, host,
                              timeout=timedelta(seconds=connect_timeout_s), wait_for_workers=False, multi_tenant=host)
        self._base.set_timeout(timedelta(seconds=op_timeout_s))
        self.op_timeout_s = op_timeout_s
        if not getattr(self._base, "has_extended_api", lambda: False)():  # not in torch's stubs
            raise LaunchError("this PyTorch's TCPStore lacks append/multi_get, which cluster mode needs; use a newer PyTorch")
        self.store = self._wrap(self._base)

    def _wrap(self, base: Any) -> Any:
        from torch.distributed import PrefixStore

        return PrefixStore(self.prefix, base)

    def another_connection(self) -> Rendezvous:
        """A second client for another thread (one client is not shared between threads)."""
        from torch.distributed import TCPStore

        other = object.__new__(Rendezvous)
        other.launch, other.prefix, other.op_timeout_s = self.launch, self.prefix, self.op_timeout_s
        other._base = TCPStore(self.launch.master_addr, self.launch.master_port, None, False,
                               timeout=timedelta(seconds=self.op_timeout_s))
        other.store = other._wrap(other._base)
        return other

    def log(self, name: str, rank: int) -> None:
        self.store.append(f"log/{name}", f"{rank},")

    def logged(self, name: str) -> set[int]:
        key = f"log/{name}"
        if not self.store.check([key]):
            return set()
        return {int(r) for r in self.store.get(key).decode().split(",") if r}

    def put(self, key: str, value: Any) -> None:
        self.store.set(key, json.dumps(value))

    def get(self, key: str) -> Any:
        """The JSON value of `key`, or None when nobody has posted it."""
        if not self.store.check([key]):
            return None
        return json.loads(self.store.get(key))

    def put_packed(self, key: str, value: Any) -> None:
        self.store.set(key, zlib.compress(json.dumps(value, separators=(",", ":")).encode(), 6))

    def get_packed_many(self, keys: list[str]) -> list[Any]:
        if not keys:
            return []
        return [json.loads(zlib.decompress(blob)) for blob in self.store.multi_get(keys)]

    def counters(self, keys: list[str]) -> list[int]:
        return [int(v) for v in self.store.multi_get(keys)] if keys else []

    def wait_for(self, key: str, seconds: float) -> Any:
        """The value of `key` once posted, or None after `seconds`. The store answers when the key
        appears, so a thousand waiting nodes do not poll it; if rank 0 dies the wait fails at once."""
        from torch.distributed import DistStoreError

        try:
            self.store.wait([key], timedelta(seconds=max(0.001, seconds)))
        except DistStoreError as err:
            if "timeout" not in str(err).lower():
                raise
            return None
        return self.get(key)


class Heartbeat:
    """A counter the node bumps from a thread, on its own connection, with the step it is in."""

    def __init__(self, rendezvous: Rendezvous, rank: int, interval_s: float):
        self.rank, self.interval_s = rank, interval_s
        self.step = "joining"
        self._store = rendezvous.another_connection()
        self._stop = threading.Event()
        self._posted_step: str | None = None
        self._thread = threading.Thread(target=self._run, name="gpuvet-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.beat()  # the first beat exists before the node says it joined: rank 0 can read it at once
        self._thread.start()
        return self

    def beat(self) -> None:
        self._store.store.add(f"beat/{self.rank}", 1)
        if self.step != self._posted_step:
            self._posted_step = self.step
            self._store.store.set(f"step/{self.rank}", self.step)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception:  # rank 0 (the store) went away: the main flow finds out by itself
                return

    def stop(self) -> None:
        self._stop.set()
