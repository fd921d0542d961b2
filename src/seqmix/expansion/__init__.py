"""A study validated with its task and mixer classes and expanded: the part of reading a study
that needs those classes (and so torch), above seqmix.tasks and seqmix.mixers. Everything below
them is seqmix.study's: reading a profile, the settings, the job specs, the sweeps, the job
table as the Snakefile reads it.

Modules: ``validate`` (a profile's keys validated into a ``Study``: the task kinds' settings,
the mixers' options, the checks between sections; the JSON schema) and ``table`` (the
expansion: tasks, runs, paths, specs; and the job table). This file imports nothing.
"""
