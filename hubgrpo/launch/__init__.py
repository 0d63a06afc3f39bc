"""Starting workers on machines people rent: Hugging Face Jobs (``hubgrpo launch``, ``hubgrpo jobs``) and the
one-line install of the exact hubgrpo a run's Space coordinates with (``wheel``). No torch, no gradio."""
