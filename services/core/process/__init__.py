"""One gpudra process: its flags (with environment fallbacks) and how it runs. The top
layer: it may import every other."""
