"""The study: a profile read, validated and turned into the jobs that run it. The words it
uses (profile, study, expansion, task, run, job, ...) each mean one thing, defined in
``seqmix.study.glossary``.

Modules, bottom up: ``settings`` (the sections), ``jobs`` (the specs), ``sweep`` (a task's
grid), ``load`` (reading and validating a profile; imports the task and mixer classes, hence
torch), ``table`` (the expansion: tasks, runs, paths, specs; and the job table), ``dag`` (the
job table as the Snakefile reads it, without torch). This file imports nothing: ``seqmix.study.settings`` sits
below the mixers and tasks, ``seqmix.study.dag`` above everything.
"""
