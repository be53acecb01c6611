"""Fake vendor packages, each as strict as the release it names (see each module)."""
