"""Testing support: the pytest plugin, device fixtures, the device conformance suite."""
