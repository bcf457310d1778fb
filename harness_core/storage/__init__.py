"""Session storage backends (memory, JSONL, SQLite, Redis Streams) and `open_repo(url)`."""
