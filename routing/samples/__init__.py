"""Training samples: the bounded store that keeps coverage across load levels, and its durable SQLite file."""
