"""The Higgs Audio v3 talker: config, PyTorch modules, checkpoint loading, tokenizer and prompts.

Entry points: :func:`realtime_engine.model.loader.load_talker`,
:func:`realtime_engine.model.hub.resolve_model`,
:mod:`realtime_engine.model.prompts`. See docs/talker-model.md.
"""
