"""Device-operations backends: real (nvidia-smi, NVML, sysfs, MPS) and simulated."""
