"""Worker providers: what acquires and releases worker processes for the planner (docs/DEPLOY.md).

The interface is small on purpose, so another platform can be added:

```python
class Provider:
    name: str                      # what `--provider` calls it
    config: PoolConfig             # min_workers, max_workers (None: cannot grow), cooldown
    def apply(self, wish: PoolWish) -> None: ...        # have wish.workers workers; stop wish.release
    def release_order(self, live) -> dict | None: ...   # rank: highest released first (None: newest)
    def restrict(self, live, release) -> tuple: ...     # the subset of `release` it can stop
```

`apply` is called on the planner's event loop whenever the wish changes; it must not block (a slow call
runs in a thread). Workers it starts register with the planner like any other (`clasp worker
--planner ADDR`) and join the running jobs at once; workers it stops get SIGTERM, which drains them
(`clasp.runtime.elastic`). The planner's pure decisions are `clasp.core.pool`.

- `static`: today's pool: whatever registers; nothing is asked for or given back.
- `local`: the wish is served to the local cluster's supervisor (`clasp.local.cluster`), which polls it with
  the `pool` request and starts or stops worker processes (a SpecCluster-style reconciliation).
- `kubernetes`: patches the `scale` subresource of the worker StatefulSet with the official client,
  in-cluster configuration, RBAC limited to that one object (deploy/kubernetes.yaml). A StatefulSet
  removes its highest ordinals first, so only idle workers at the top of the ordinals are released.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence

from clasp.core.pool import PoolConfig, PoolWish

log = logging.getLogger("clasp.planner")
PROVIDERS = ("static", "local", "kubernetes")
_ORDINAL = re.compile(r"-(\d+)$")


class Provider:
    """The static provider, and the base of the others."""

    name = "static"

    def __init__(self, config: PoolConfig | None = None):
        self.config = config or PoolConfig()
        self.wish: PoolWish | None = None

    def apply(self, wish: PoolWish) -> None:
        self.wish = wish

    def release_order(self, live: Sequence[str]) -> dict[str, float] | None:
        return None

    def restrict(self, live: Sequence[str], release: Sequence[str]) -> tuple[str, ...]:
        return tuple(release)


class LocalProvider(Provider):
    """The planner's side of the local cluster: the wish waits for the cluster's supervisor to read it."""

    name = "local"


class KubernetesProvider(Provider):
    """Scales the worker StatefulSet (`statefulset`, in the pod's own namespace unless given)."""

    name = "kubernetes"

    def __init__(self, config: PoolConfig, statefulset: str = "clasp-worker", namespace: str | None = None):
        super().__init__(config)
        self.statefulset = statefulset
        self.namespace = namespace
        self._api = None
        self._lock = threading.Lock()

    def _client(self):
        if self._api is None:
            try:
                from kubernetes import client, config
            except ImportError as e:  # the optional extra: pip install 'clasp[kubernetes]'
                raise RuntimeError("the kubernetes provider needs the kubernetes client: "
                                   "pip install 'clasp[kubernetes]'") from e
            config.load_incluster_config()
            if self.namespace is None:
                with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
                    self.namespace = f.read().strip()
            self._api = client.AppsV1Api()
        return self._api

    def apply(self, wish: PoolWish) -> None:
        old, self.wish = self.wish, wish
        if old is not None and old.workers == wish.workers:
            return
        threading.Thread(target=self._scale, args=(wish.workers,), name="clasp-k8s-scale", daemon=True).start()

    def _scale(self, replicas: int) -> None:
        with self._lock:
            try:
                self._client().patch_namespaced_stateful_set_scale(
                    self.statefulset, self.namespace, {"spec": {"replicas": replicas}})
                log.info("kubernetes: statefulset %s scaled to %d replicas", self.statefulset, replicas)
            except Exception as e:  # the planner keeps running with the workers it has
                log.error("kubernetes: could not scale statefulset %s to %d: %s", self.statefulset, replicas, e)

    @staticmethod
    def ordinal(worker: str) -> int | None:
        m = _ORDINAL.search(worker)
        return int(m.group(1)) if m else None

    def release_order(self, live: Sequence[str]) -> dict[str, float]:
        return {w: float(self.ordinal(w) if self.ordinal(w) is not None else -1) for w in live}

    def restrict(self, live: Sequence[str], release: Sequence[str]) -> tuple[str, ...]:
        """Only the top ordinals: scaling down to n removes the pods numbered n and above."""
        ordered = sorted(live, key=lambda w: -(self.ordinal(w) if self.ordinal(w) is not None else -1))
        out = []
        chosen = set(release)
        for w in ordered:
            if w not in chosen:
                break
            out.append(w)
        return tuple(out)


def make_provider(name: str, config: PoolConfig, statefulset: str = "clasp-worker") -> Provider:
    if name == "static":
        return Provider(PoolConfig(config.min_workers, None, config.cooldown, config.join_timeout))
    if name == "local":
        return LocalProvider(config)
    if name == "kubernetes":
        return KubernetesProvider(config, statefulset)
    raise ValueError(f"unknown provider {name!r}; accepted: {', '.join(PROVIDERS)}")
