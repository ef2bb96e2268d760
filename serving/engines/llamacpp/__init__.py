"""The `llamacpp` engine: llama.cpp on CPU, serving a GGUF (the deployment form: converted and quantized by
llama.cpp's own tools). `llama-server` generates with continuous batching; the bindings score prompts."""
