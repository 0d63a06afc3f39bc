"""Helpers shared by the tests: emulators, local servers, fakes, fixtures. No tests here."""
