"""The coordinator served over HTTP: the JSON API, the Gradio Space page, uploads, auth and deployment.

``api`` (the endpoints, the admission queue, the merge thread), ``app`` (the Space: page + API + ``upload``),
``view`` (tables and plots from the status JSON), ``upload`` (checked, batched submissions from workers without
write access), ``auth`` (HF tokens → users, rate limits), ``deploy`` (``hubgrpo space deploy``). Imports gradio;
never the training side.
"""
