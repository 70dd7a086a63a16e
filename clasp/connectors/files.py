"""File connectors: `FileSource` (clasp/connectors/file_source.py)."""

from clasp.connectors.file_source import FileSource

__all__ = ["FileSource"]
