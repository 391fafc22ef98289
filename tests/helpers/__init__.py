"""Helpers shared by tests: fakes of the components gpudra talks to."""
