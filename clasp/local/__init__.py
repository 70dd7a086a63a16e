"""Running a cluster on this machine: planner and worker processes (`cluster`), per-worker network
namespaces (`netns`) and CPU quotas (`cpulimit`)."""
