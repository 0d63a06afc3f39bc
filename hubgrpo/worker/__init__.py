"""The training side: a worker's loop and everything it needs to train a round.

``loop`` (lease → download → train → commit → submit), ``client`` (the coordinator API over HTTP), ``engine`` (one
GRPO + LoRA round with TRL and PEFT), ``models`` (base model + tokenizer loading, the built-in models),
``adapter_io`` (checked adapter loading/saving), ``progress`` (per-step output) and ``train`` (``hubgrpo train``,
the single-process baseline). Never imports the coordinator or the Space.
"""
