"""Chat: the service adapters and the CLI use, what a message means, threads, cards, the outbox."""
