"""File connectors: `FileSource` (clasp/connectors/file_source.py) and `FileSink` (clasp/connectors/file_sink.py)."""

from clasp.connectors.file_sink import FileSink
from clasp.connectors.file_source import FileSource

__all__ = ["FileSink", "FileSource"]
