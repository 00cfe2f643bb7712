"""kagent-memory-governed."""
