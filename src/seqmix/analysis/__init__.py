"""Analyses: cost vs sequence length, training throughput, Su's attention sparsity, Grassmann geometry."""
