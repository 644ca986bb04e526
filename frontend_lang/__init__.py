"""The SGLang-compatible DSL for multi-call agent programs."""
