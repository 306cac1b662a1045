"""The PII guard: recognizers, the guard that redacts or rejects, and the hooks that install it."""
