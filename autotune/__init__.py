"""autotune: measured search for the best vLLM serving configuration."""

__version__ = "0.1.0"
