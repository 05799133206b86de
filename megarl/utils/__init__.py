"""Controller utilities: checkpoint layout/tracker, metric sinks, timers, curve plotting."""
