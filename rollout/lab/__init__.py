"""The local lab: a real control plane and SSH/netns nodes, for tests and demos."""
