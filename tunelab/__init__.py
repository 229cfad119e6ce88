"""tunelab: LitGPT fine-tuning recipes, with the tools that plan, run, measure and report them."""

__version__ = "0.1.0"
