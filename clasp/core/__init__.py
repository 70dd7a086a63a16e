"""The pure core: the data model (DAG, protocol, routing, tracking) and the policy logic (capacity model,
estimator, placement, parallelism, control loop, migration planning, policies).

Imports only the standard library, numpy, msgpack and cloudpickle (networkx for `Dag.graph()` alone): no
asyncio, zmq or subprocess (tests/unit/test_layers.py checks it in a fresh interpreter), so all of it is
testable without sockets or an event loop. See docs/ARCHITECTURE.md for the layers.
"""
