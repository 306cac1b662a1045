"""The ``kestrel`` command and the composition root (the one place that names concrete parts)."""
