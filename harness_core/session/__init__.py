"""The session model: entries, records, facts, log items, queries and the storage contract."""
