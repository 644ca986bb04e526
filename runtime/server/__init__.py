"""The HTTP server: SGLang-native routes, the OpenAI-compatible API, metrics."""
