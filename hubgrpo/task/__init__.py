"""What a run learns: its prompts (``data``: data sets, files, built-in tasks) and how completions are scored
(``rewards``). Shared by the workers (training, evaluation) and the coordinator (checking rewards); no torch.
"""
