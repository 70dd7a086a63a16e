"""clasp workers."""
