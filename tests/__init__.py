"""clasp tests."""
