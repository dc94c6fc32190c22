"""Plain builders and fakes the tests share (fixtures that set up and tear down state are in
tests/conftest.py)."""
