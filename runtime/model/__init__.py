"""Model execution: checkpoint loading, models, attention backends, runner, sampler."""
