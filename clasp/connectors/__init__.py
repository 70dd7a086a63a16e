"""Connectors: sources read by the workers and sinks committed with the checkpoints (docs/CONNECTORS.md).

The interfaces live in `clasp.core.connector` (pure: the DAG checks against them). Each connector's real
dependency is an optional extra, imported only when the connector is used.
"""

from clasp.core.connector import Sink, SinkPartition, Source, SourcePartition

__all__ = ["Sink", "SinkPartition", "Source", "SourcePartition"]
