"""clasp bench."""
