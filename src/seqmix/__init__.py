"""seqmix: a reproducible pipeline that tests, with numbers, whether softmax attention
is what sequence models need. Importing the package is cheap (no torch); the heavy
modules are imported by the commands that need them."""

__version__ = "0.1.0"
