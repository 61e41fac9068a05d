"""agentrl.messages."""
