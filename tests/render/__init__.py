"""Helpers for the diagram tests: Mermaid in headless Chromium."""
