"""Token-level radix tree of KV-cache pages with LRU eviction (pure Python, no torch)."""
