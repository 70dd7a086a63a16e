"""clasp planner."""
