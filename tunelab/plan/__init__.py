"""Plan: predict memory, fit, runtime and energy of a recipe before launch (no GPU needed)."""
