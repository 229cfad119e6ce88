"""The data tunelab ships and builds: the Alpaca-format dataset, the benchmark workload, litgpt data modules."""
