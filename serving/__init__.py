"""Serving: the OpenAI-compatible gateway (HTTP layer, auth, limits, metrics, request log, model slot, shadow,
canary) and the inference engines behind it (`serving.engines`), joined only by `serving.engine`'s contract."""
