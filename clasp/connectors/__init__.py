"""Connectors: sources read by the workers and sinks committed with the checkpoints (docs/CONNECTORS.md).

`clasp.connectors.base` holds the interfaces; each connector's real dependency is an optional extra, imported only
when the connector is used.
"""

from clasp.connectors.base import Sink, SinkPartition, Source, SourcePartition

__all__ = ["Sink", "SinkPartition", "Source", "SourcePartition"]
