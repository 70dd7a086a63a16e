"""clasp apps."""
