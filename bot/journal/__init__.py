"""The journal: its entries, the pure fold that rebuilds a run, and the run's fenced writer."""
