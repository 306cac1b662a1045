"""People: who may do what to a run (policy), the decisions that reach runs, and their audit."""
