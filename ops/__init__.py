"""agentrl.ops."""
