"""A replica among replicas: the work queue's taker, schedules, metrics and health."""
