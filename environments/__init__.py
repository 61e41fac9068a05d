"""agentrl.environments."""
