"""Dreamer on TorchRL: ``python -m dreamer`` (see README.md)."""
