"""Models built from any mixer: a causal LM and a sentence-pair classifier."""
