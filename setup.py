"""The package list, found: every package under src/ and kernels/ as seqmix.kernels (its
folder is mapped in pyproject.toml's package-dir). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=[*find_packages("src"), *(f"seqmix.{p}" for p in find_packages(".", include=["kernels", "kernels.*"]))])
