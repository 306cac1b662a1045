"""The run: one loop per turn, its tool calls, its gate, its interrupts, and the supervisor."""
