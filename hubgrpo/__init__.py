"""hubgrpo: asynchronous GRPO + LoRA across machines that share only a Hub repo and a Gradio Space."""

__version__ = "0.1.0"
