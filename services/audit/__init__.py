"""``gpudra audit``: replay, filter and verify the claim event trail (the CLAIMS stream)."""
