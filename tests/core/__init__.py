"""Tests of the pure core (table-driven, small builders, no mocks)."""
