"""Helpers the test files share (no tests here)."""
