"""The study as data, at the bottom of the stack: a profile read once, validated against these
settings above, and turned into the jobs that run it. The words it uses (profile, study,
expansion, task, run, job, ...) each mean one thing, defined in ``seqmix.study.glossary``.

Modules: ``profile`` (reading a profile: a file or a JSON object, what it ``extends``, the
overrides, its numerics), ``settings`` (the sections, typed), ``jobs`` (the job specs),
``sweep`` (a task's grid), ``dag`` (the job table as the Snakefile reads it). None imports
torch, a task or a mixer (tests/project/test_code_shape.py keeps that so): what needs their classes,
validating a study and expanding it, is seqmix.expansion, above them. This file imports nothing.
"""
