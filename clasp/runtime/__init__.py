"""The asyncio + ZeroMQ shells around the core: planner, worker (and its job engine), state server, client.

Each process here owns its sockets and its event loop and delegates every decision to `clasp.core`.
"""
