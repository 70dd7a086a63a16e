"""clasp: an elastic stream-processing runtime implementing CLASP's capacity-aware placement."""

from clasp.core.dag import Dag, DagError, Operator, identity

__all__ = ["Dag", "DagError", "Operator", "identity", "connect", "ClaspError", "ClaspTimeout", "PlannerUnavailable",
           "AuthError"]
__version__ = "0.1.0"


def __getattr__(name):
    # The client pulls in pyzmq; keep `import clasp` light for the pure core and for workers.
    if name in ("connect", "ClaspError", "ClaspTimeout", "PlannerUnavailable", "Client", "Job", "AuthError"):
        from clasp.runtime import client

        return getattr(client, name)
    raise AttributeError(name)
