"""Analyses: cost vs sequence length, Su's attention sparsity, Grassmann geometry."""
