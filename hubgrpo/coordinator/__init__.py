"""The coordinator role: leases, admission of submissions, merges into tagged versions, run status.

``core`` (the ``Coordinator``: a pure function of repo contents + clock, no network of its own, no gradio),
``leasing`` (who gets a lease, for which prompts; ``lease_signing``, ``prompt_pool``), ``admission`` (two-phase
checks of submitted rounds), ``merging`` (plan → compute → CAS commit + tag of one version),
``status`` (the status JSON), ``repo_init`` (the first commit of a run). Never imports the training side
(``hubgrpo.worker``): it needs no model, only adapters as tensors (``hubgrpo.merge``).
"""
