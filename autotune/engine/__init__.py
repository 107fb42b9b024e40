"""Everything that knows vLLM: which build is installed and its defaults, flags to argv, the server process,
its log, and where a model comes from."""
