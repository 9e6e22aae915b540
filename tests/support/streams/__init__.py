"""Recorded streams of real OpenAI-compatible servers (vLLM, llama.cpp, Ollama) and the server that replays them."""
