"""Generated from proto/ by proto/generate.py (`make proto`). Do not edit."""
