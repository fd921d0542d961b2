"""The words of seqmix: each means one thing here, in names, messages, columns and docs alike.

A module of its own that nothing imports, so that editing a definition is no run's code
(seqmix.sources: a package's ``__init__`` is in the code of every job that imports from it).

- profile: a config file describing a whole study (``config/config.yaml``, the quick one;
  ``config/paper.yaml``); it may ``extends:`` another. Read once per process, with what it
  extends and any overrides (``seqmix.study.profile.read_profile``, a ``Profile``: its keys,
  the files read, its numerics). How Snakemake runs the jobs (local,
  SLURM) is its *executor*: ``workflow/executors/``, passed to ``snakemake --profile``.
- study: a profile read with the schema's defaults and validated (``settings.Study``, made by
  ``seqmix.expansion.validate``, the one place that validates with the task and mixer classes).
- expansion: a study expanded once (``seqmix.expansion.table.expand``, an ``Expansion``): its
  tasks (sweeps expanded), runs and analysis selections, with the paths and specs built from
  them; made once per process and passed where the study was (the job table, the plan). The
  preflight reads the specs it builds (``preflight.Specs``), from it or from the job table.
- settings: the typed keys of one section of a profile (``TrainSettings`` is ``train:``);
  a task kind adds its own (``TaskSettings``), a mixer its ``Options`` (seqmix.mixers). A
  job's spec carries settings (``ThroughputJob.throughput`` is a ``ThroughputSettings``, named
  ``settings`` in code, never ``spec``). What a process's ``configure()`` set is ``CONFIGURED``
  (seqmix.train.provenance, seqmix.mkl_shim); the values ``train.implementation`` takes are
  ``seqmix.mixers.dispatch.IMPLEMENTATIONS``.
- kind: what a task does (``mqar``, ``wikitext2``, ``snli``): a ``seqmix.tasks`` ``Task``
  class, one line of ``seqmix.catalogue``.
- task: one named task of the study, ``<kind>`` or ``<kind>/<variant>`` under ``tasks:`` (a
  *variant*: one of several tasks of a kind, each with its own settings, data and runs); a
  ``sweep`` turns it into one task per point of its grid, ``<task>/<point>``
  (``mqar/L64-kv4/d64-lr0.001``), each carrying the values it sets (its ``axes``). The task
  as written is its ``group``: the points of a sweep share its data. ``expansion.table.StudyTask``,
  named ``task`` in code (never ``v``).
- run: one (task, architecture, seed), trained into ``<results_dir>/runs/<task>/<arch>/seed<k>/``;
  its *name* is ``<task>/<arch>/seed<k>`` (``TrainJob.run_name``), its logs' and messages'.
- job: one Snakemake job (train a run, evaluate it, an analysis, a notebook); its *spec* is
  what it reads, a ``*Job`` model of ``jobs`` (``TrainJob`` for a run), given as JSON
  (``--spec``); the *job table* lists every job of a study with its spec (``expansion.table.job_table``).
- kernel: a fast path of ``kernels/`` (``seqmix.kernels``), declared with the reference it
  equals by the mixer module that runs it (``seqmix.mixers.base.kernel``; listed by
  ``seqmix.mixers.declared_kernels()``). The f of an attention row a_j ∝ f(q·k_j) (exp
  for softmax, relu², ...) is its *score function* (``analysis.su.SCORE_FUNCTIONS``); only the
  sparsity analysis's files, as Su does, call it ``kernel`` (sparsity_analytic.csv's column,
  a claim's key), and keep that name.
- repository: the checkout, ``seqmix.REPO_ROOT`` (``REPO`` in the workflow's rules and the
  tests, ``repo:<path>`` in notebooks/outputs.yaml); ``SRC`` is its ``src/`` folder, the
  package's code (seqmix.study.dag), and nothing else.
- title: how a table or a figure prints a name: a mixer's or a task kind's ``title`` in
  ``seqmix.catalogue`` (``catalogue.title(name)``, ``report.style.arch_title``). ``label``
  keeps the meaning its libraries give it: the targets a model is trained to predict
  (MQAR's, SNLI's), LaTeX's ``\\label`` and matplotlib's ``label=``.
- code: a job's code, the modules its command runs and every module of this project they
  import, found from the imports, as one digest (``seqmix.sources``); a run is identified by
  its settings and its code, and never resumes a checkpoint of other code.
- sources: the files of a job's code, each with its digest (``{file: digest}``:
  ``Code.sources()``, provenance.json's ``code.sources``, a fingerprint's ``sources``), found
  by ``seqmix.sources``; nothing else. Raw data come from ``seqmix.data.raw`` (its ``Source``,
  the config's ``data.source``: the hub or the mirror a raw file is read from), a claim's paper
  is its ``source`` (paper/claims.yaml), and the report's ``.tex`` files are its LaTeX files.
- load: read a file into this process: a checkpoint (``train.checkpoint.load``), a profile
  validated (``expansion.validate.load_study``), a run (``train.evaluate.load_run``), raw data
  (``data.raw.load_wikitext2``), claims, a tokenizer, and oneMKL's shim (``mkl_shim.load``,
  a shared library). Importing an object by its ``"module:attribute"`` name is *import*
  (``catalogue.imported``, a kernel declaration's ``importer``); the Snakefile's job table is
  *read* (``seqmix.study.dag.read_jobs``). A machine's *load average* keeps its usual meaning.
- registry: the package registry (PyPI, or the index pip is pointed at): a GPU machine without
  one installs the wheels ``make gpu-wheels`` gathered. Nothing of seqmix is a registry: a
  mixer's kernels are its module's declarations (``seqmix.mixers.declared_kernels()``), the
  benchmarks' launch cases are ``tools/bench/launches.py``.
- chance: the chance level of a task's test metric (``Task.chance``; MQAR: 1 / key-value
  pairs), runs.csv's ``chance``; the recall figure draws it dotted, its legend giving the value
  (``chance (1/8 = 0.125)``). The *informed-chance level* is ln(1 / chance), the loss of a model
  that outputs a value of its context without knowing which.
- numerics: which code path each CPU library takes (``portable`` pins them, ``native`` lets
  the host choose: ``seqmix.numerics``); the *fingerprint* is the hash of every mixer's weights
  after a few steps under them (``seqmix.fingerprint``).
- pack (seed pack): the seeds of one (task, architecture) trained in one process as one
  vectorised model (``seqmix.train.pack``), where the task's ``train.pack`` says so; one job
  (``PackJob``, rule ``train_pack``) whose members each write their single run's files. A
  mixer or task that cannot be vectorised (its ``packable``) is refused, never unpacked silently.
"""
