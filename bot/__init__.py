"""Kestrel: a chat-ops agent running a durable LLM agent loop, with people in the loop."""

__version__ = "0.2.0"
DISTRIBUTION = "kestrel-chatops"
