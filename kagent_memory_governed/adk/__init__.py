"""Adapters between governed memory and the kagent-adk 0.9.11 / google-adk runtime."""
