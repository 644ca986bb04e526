"""The scheduler: Req, KV bookkeeping, policy, the step loop and its process."""
